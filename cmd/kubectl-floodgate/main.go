// Command kubectl-floodgate is floodgate's kubectl plugin: `kubectl
// floodgate check|explain|simulate|status`. See package app and
// docs/kubectl-floodgate.md.
package main

import (
	"os"

	"github.com/floodgate-dev/floodgate/cmd/kubectl-floodgate/app"
)

func main() {
	os.Exit(app.Main(os.Args[1:], app.Streams{In: os.Stdin, Out: os.Stdout, ErrOut: os.Stderr}))
}
