package runner

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
)

func TestCredentialsFollowThePasswordFile(t *testing.T) {
	t.Parallel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	pf := filepath.Join(dir, "password")

	// Standalone: the file must exist at the start.
	if _, err := (&Config{RedisPassFile: pf}).credentials(log); err == nil {
		t.Error("a missing password file was accepted outside Kubernetes mode")
	}
	// Kubernetes mode: the optional Secret volume may fill in later.
	creds, err := (&Config{RedisPassFile: pf, Kubernetes: true}).credentials(log)
	if err != nil {
		t.Fatal(err)
	}
	if _, pw := creds(); pw != "" {
		t.Errorf("password %q before the file exists, want none", pw)
	}
	for _, want := range []string{"first", "rotated"} {
		if err := os.WriteFile(pf, []byte(want+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, pw := creds(); pw != want {
			t.Errorf("password %q, want %q: the file is read again for every connection", pw, want)
		}
	}
	// A file that goes away (a Secret volume mid-update) keeps the last.
	if err := os.Remove(pf); err != nil {
		t.Fatal(err)
	}
	if _, pw := creds(); pw != "rotated" {
		t.Errorf("password %q after the file went away, want the last one read", pw)
	}
	// Without a file, the environment's password is used as given.
	creds, err = (&Config{RedisPassword: "from-env"}).credentials(log)
	if err != nil {
		t.Fatal(err)
	}
	if _, pw := creds(); pw != "from-env" {
		t.Errorf("password %q, want the environment's", pw)
	}
}
