package runner

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
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

	// The ACL user is read with the password; without its file, the
	// default user.
	uf := filepath.Join(dir, "username")
	if err := os.WriteFile(pf, []byte("pw"), 0o600); err != nil {
		t.Fatal(err)
	}
	creds, err = (&Config{RedisPassFile: pf, RedisUserFile: uf, Kubernetes: true}).credentials(log)
	if err != nil {
		t.Fatal(err)
	}
	if user, pw := creds(); user != "" || pw != "pw" {
		t.Errorf("credentials (%q, %q) without a username file, want the default user and pw", user, pw)
	}
	if err := os.WriteFile(uf, []byte("floodgate-sidecar\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if user, pw := creds(); user != "floodgate-sidecar" || pw != "pw" {
		t.Errorf("credentials (%q, %q), want (floodgate-sidecar, pw)", user, pw)
	}
	if err := (&Config{RedisUserFile: uf, Listen: ":0"}).Validate(); err == nil || !strings.Contains(err.Error(), "--redis-username-file") {
		t.Errorf("Validate with a username file and no password file: %v, want an error naming --redis-username-file", err)
	}
}
