// Command pause is the pod sandbox's process, as Kubernetes' own pause
// image runs: it holds the pod's namespaces, reaps the zombies of a shared
// PID namespace, and exits 0 on SIGINT or SIGTERM. It is built into the
// pause image of `make images`, because no registry is reachable here to
// pull registry.k8s.io/pause.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 4)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for s := range sigs {
		if s != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
