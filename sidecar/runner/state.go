package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"time"

	"github.com/floodgate-dev/floodgate/sidecar/config"
	"github.com/floodgate-dev/floodgate/sidecar/configsource"
)

// StateFile is the file in --state-dir that holds the last document the
// sidecar applied from its source.
const StateFile = "last-good-config.json"

// save writes the document in force to the state directory, atomically,
// so that a restarted sidecar enforces it until its source answers. The
// caller holds applyMu.
func (r *Runner) save(data []byte) {
	if r.cfg.StateDir == "" || data == nil {
		return
	}
	path := filepath.Join(r.cfg.StateDir, StateFile)
	if old, err := os.ReadFile(path); err == nil && bytes.Equal(old, data) {
		return
	}
	tmp, err := os.CreateTemp(r.cfg.StateDir, ".last-good-*")
	if err == nil {
		_, err = tmp.Write(data)
		if cerr := tmp.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = os.Rename(tmp.Name(), path)
		}
		if err != nil {
			_ = os.Remove(tmp.Name())
		}
	}
	if err != nil {
		r.log.Warn("cannot save the config in force to the state directory; a restart will wait for the source", "dir", r.cfg.StateDir, "err", err)
	}
}

// applySaved applies the document saved in the state directory, if any,
// before the source has delivered anything: after a restart, the sidecar
// enforces its last good revision while the API server is unreachable.
// floodgate_sidecar_config_from_state and /debug/config's fromState say
// so until the source delivers a document.
func (r *Runner) applySaved() {
	if r.cfg.StateDir == "" {
		return
	}
	path := filepath.Join(r.cfg.StateDir, StateFile)
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return
	}
	if err != nil {
		r.log.Warn("cannot read the saved config", "file", path, "err", err)
		return
	}
	r.applyMu.Lock()
	defer r.applyMu.Unlock()
	if r.lastData != nil {
		// The source was faster.
		return
	}
	origin := "state " + path + " (saved before a restart; the source has not answered yet)"
	if r.applyUpdate(configsource.Update{Data: data, Origin: origin}, true) {
		r.lastData, r.lastOrigin = data, origin
		r.log.Warn("enforcing the last good config saved before the restart until the source delivers one", "file", path, "revision", r.Status().Revision)
	}
}

// fileStamp identifies a key file's content.
type fileStamp struct {
	size  int64
	mtime time.Time
	sum   [32]byte
	err   string
}

// keyFiles lists the files a config's policies read when they compile:
// JWT secrets and key sets.
func keyFiles(c *config.Config) []string {
	var out []string
	for i := range c.Policies {
		if j := c.Policies[i].JWT; j != nil {
			for _, f := range []string{j.HMACSecretFile, j.JWKSFile} {
				if f != "" {
					out = append(out, f)
				}
			}
		}
	}
	return out
}

// stampKeyFiles fingerprints the key files of c.
func stampKeyFiles(c *config.Config) map[string]fileStamp {
	files := keyFiles(c)
	if len(files) == 0 {
		return nil
	}
	out := make(map[string]fileStamp, len(files))
	for _, f := range files {
		out[f] = stamp(f)
	}
	return out
}

func stamp(path string) fileStamp {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{err: err.Error()}
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return fileStamp{err: err.Error()}
	}
	return fileStamp{size: st.Size(), mtime: st.ModTime(), sum: sha256.Sum256(data)}
}

// watchKeyFiles applies the document in force again whenever a key file it
// names changes (a Secret or ConfigMap the kubelet updated, a rotated
// JWKS), so that new keys verify tokens without a policy edit; a policy
// whose key file became unreadable fails alone. It polls every
// --policy-poll-interval until ctx ends.
func (r *Runner) watchKeyFiles(ctx context.Context) {
	t := time.NewTicker(r.cfg.PollInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		r.applyMu.Lock()
		changed := ""
		for f, old := range r.keys {
			if now := stamp(f); now != old {
				changed = f
				break
			}
		}
		if changed != "" && r.lastData != nil {
			r.log.Info("a key file changed; applying the config in force again", "file", changed)
			origin := r.lastOrigin
			if r.applyUpdate(configsource.Update{Data: r.lastData, Origin: origin}, r.Status().FromState) {
				r.lastOrigin = origin
			}
		}
		r.applyMu.Unlock()
	}
}
