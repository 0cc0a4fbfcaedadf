//go:build !linux

package harness

import (
	"errors"
	"net"
)

func serveEpollAnswer(net.Listener, <-chan struct{}) error {
	return errors.New("the epoll floor needs Linux")
}
