package configsource

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"syscall"
	"time"
)

// FileSource watches one file by polling: it compares the file's identity
// (device and inode, after following symlinks), size and modification
// time, and reads the file when they change, so an atomic rename-replace
// write, an in-place write and a Kubernetes ConfigMap volume's symlink swap
// are all seen. A document whose bytes equal the last one delivered is not
// delivered again. A read error is delivered once, until the file changes.
type FileSource struct {
	Path     string
	Interval time.Duration
}

type fileStamp struct {
	dev, ino uint64
	size     int64
	mod      time.Time
	err      string
}

func stampOf(path string) fileStamp {
	fi, err := os.Stat(path)
	if err != nil {
		return fileStamp{err: err.Error()}
	}
	s := fileStamp{size: fi.Size(), mod: fi.ModTime()}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		s.dev, s.ino = uint64(st.Dev), uint64(st.Ino) //nolint:unconvert // the field types differ between platforms
	}
	return s
}

// Run implements Source.
func (f *FileSource) Run(ctx context.Context, deliver func(Update)) {
	var last fileStamp
	var lastData []byte
	first := true
	t := time.NewTicker(f.Interval)
	defer t.Stop()
	for {
		st := stampOf(f.Path)
		// A file rewritten within the clock's resolution keeps its stamp,
		// so an unchanged stamp younger than two intervals is re-read.
		recent := time.Since(st.mod) < 2*f.Interval
		if first || st != last || recent {
			switch {
			case st.err != "":
				if first || st.err != last.err {
					deliver(Update{Err: fmt.Errorf("policy file: %s", st.err), Origin: f.Path})
				}
			default:
				data, err := os.ReadFile(f.Path)
				switch {
				case err != nil:
					st.err = err.Error()
					if first || st.err != last.err {
						deliver(Update{Err: fmt.Errorf("policy file: %w", err), Origin: f.Path})
					}
				case first || !bytes.Equal(data, lastData) || last.err != "":
					lastData = data
					deliver(Update{Data: data, Origin: f.Path})
				}
			}
			last, first = st, false
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
