//go:build linux

package harness

import (
	"bytes"
	"fmt"
	"net"

	"golang.org/x/sys/unix"
)

// serveEpollAnswer answers with one level-triggered epoll loop and raw
// system calls, as nginx does, until ln is closed.
func serveEpollAnswer(ln net.Listener, done <-chan struct{}) error {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return fmt.Errorf("epoll floor: not a TCP listener")
	}
	f, err := tl.File()
	if err != nil {
		return err
	}
	defer func() { _ = f.Close() }()
	lfd := int(f.Fd())
	if err := unix.SetNonblock(lfd, true); err != nil {
		return err
	}
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		return err
	}
	defer func() { _ = unix.Close(ep) }()
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, lfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(lfd)}); err != nil {
		return err
	}
	bufs := map[int][]byte{}
	evs := make([]unix.EpollEvent, 256)
	for {
		// A timeout, so that a closed listener is noticed.
		n, err := unix.EpollWait(ep, evs, 200)
		if err != nil && err != unix.EINTR {
			return err
		}
		select {
		case <-done:
			return nil
		default:
		}
		for _, ev := range evs[:n] {
			fd := int(ev.Fd)
			if fd == lfd {
				for {
					cfd, _, err := unix.Accept4(lfd, unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC)
					if err != nil {
						break
					}
					_ = unix.SetsockoptInt(cfd, unix.IPPROTO_TCP, unix.TCP_NODELAY, 1)
					bufs[cfd] = make([]byte, 0, 4096)
					_ = unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, cfd, &unix.EpollEvent{Events: unix.EPOLLIN, Fd: int32(cfd)})
				}
				continue
			}
			b := bufs[fd]
			m, err := unix.Read(fd, b[len(b):cap(b)])
			if err == unix.EAGAIN {
				continue
			}
			if m <= 0 || err != nil || len(b)+m == cap(b) {
				_ = unix.Close(fd)
				delete(bufs, fd)
				continue
			}
			b = b[:len(b)+m]
			for {
				i := bytes.Index(b, crlf2)
				if i < 0 {
					break
				}
				_, _ = unix.Write(fd, floorAnswer)
				b = b[:copy(b, b[i+4:])]
			}
			bufs[fd] = b
		}
	}
}
