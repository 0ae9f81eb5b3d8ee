// Command pause is the sandbox ("pause") container of the simulator's real nodes: it holds a pod's
// namespaces, reaps the zombies of a pod sharing its PID namespace and exits 0 on SIGINT or SIGTERM,
// like registry.k8s.io/pause, which the simulator cannot pull (no traffic leaves the machine).
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 4)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
