package simnode

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// BuildSidecar builds floodgate-sidecar from the module at root into dir,
// with the given build tags, and returns its path.
func BuildSidecar(ctx context.Context, root, dir string, tags ...string) (string, error) {
	bin := filepath.Join(dir, "floodgate-sidecar")
	args := []string{"build", "-o", bin}
	if len(tags) > 0 {
		args = append(args, "-tags", joinTags(tags))
	}
	var stderr bytes.Buffer
	if _, err := Run(ctx, &stderr, root, "go", append(args, "./cmd/floodgate-sidecar")...); err != nil {
		return "", fmt.Errorf("%w: %s", err, stderr.String())
	}
	return bin, nil
}

func joinTags(tags []string) string {
	var b bytes.Buffer
	for i, t := range tags {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(t)
	}
	return b.String()
}

// Standalone is a floodgate-sidecar process run from a policy file,
// without Kubernetes.
type Standalone struct {
	*Process
	// URL is the proxy listener's, AdminURL the admin listener's.
	URL, AdminURL string
}

// StartStandalone starts bin with args plus listeners on free loopback
// ports (:0, so that no other process can take a port between its choice
// and its use), reads the addresses it bound from its log, and waits until
// it is ready (a config loaded). Its log goes to dir/sidecar.log.
func StartStandalone(ctx context.Context, bin, dir string, args ...string) (*Standalone, error) {
	logPath := filepath.Join(dir, "sidecar.log")
	p, err := StartProcess("floodgate-sidecar", logPath, nil, bin,
		append(args, "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0")...)
	if err != nil {
		return nil, err
	}
	s := &Standalone{Process: p}
	err = Poll(ctx, 50*time.Millisecond, 30*time.Second, "the sidecar's serving log line", func() (bool, error) {
		if err := p.Exited(); err != nil {
			return false, err
		}
		data, err := os.ReadFile(logPath)
		if err != nil {
			return false, nil //nolint:nilerr // not written yet: poll again
		}
		for _, line := range bytes.Split(data, []byte("\n")) {
			var l struct{ Msg, Listen, Admin string }
			if json.Unmarshal(line, &l) == nil && l.Msg == "serving" {
				s.URL, s.AdminURL = "http://"+l.Listen, "http://"+l.Admin
				return true, nil
			}
		}
		return false, nil
	})
	if err == nil {
		err = WaitHTTP(ctx, s.AdminURL+"/readyz", p, 30*time.Second)
	}
	if err != nil {
		p.Stop(time.Second)
		return nil, err
	}
	return s, nil
}
