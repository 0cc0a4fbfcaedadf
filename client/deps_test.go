package client

import (
	"os/exec"
	"strings"
	"testing"
)

// TestStandardLibraryOnly keeps the package free of dependencies: a program
// that uses it adds nothing to its module graph but this module.
func TestStandardLibraryOnly(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").Output()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Fields(string(out)); len(got) != 1 || got[0] != "github.com/floodgate-dev/floodgate/client" {
		t.Errorf("non-standard packages in the build: %v, want only the client itself", got)
	}
}
