package main

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
)

// redisTools are the programs of the Redis image: the server, the client
// its probes run, and what the managed store's start script and probes
// call (controllers/counterstore: sh -c, rm, grep, awk).
var redisTools = []string{"redis-server", "redis-cli", "sh", "rm", "grep", "awk"}

// mergedDirs are the top-level directories that a merged-/usr Debian
// makes symbolic links into /usr; the image gets the same links.
var mergedDirs = []string{"/bin", "/sbin", "/lib", "/lib64"}

// lddPath matches a library path in ldd's output: "libc.so.6 =>
// /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2
// (0x...)".
var lddPath = regexp.MustCompile(`(?m)(?:=>\s*|^\s*)(/\S+)\s+\(0x`)

// redisFiles collects the Redis image's files from this machine, where
// Debian's redis-server is installed (hack/redis-cluster.sh install), and
// returns them with the server's version.
func redisFiles() ([]file, string, error) {
	out, err := exec.Command("redis-server", "--version").Output()
	if err != nil {
		return nil, "", fmt.Errorf("redis-server --version (install it with hack/redis-cluster.sh install): %w", err)
	}
	version := ""
	if m := regexp.MustCompile(`v=(\S+)`).FindSubmatch(out); m != nil {
		version = string(m[1])
	}
	files := make([]file, 0, 64)
	files = append(files, []file{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/usr/sbin/nologin\nredis:x:999:999:redis:/data:/usr/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nredis:x:999:\n")},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/data", Dir: true, Mode: 0o770, UID: redisUser, GID: redisUser},
	}...)
	seen := map[string]bool{}
	addHostFile := func(hostPath string) error {
		at, err := canonical(hostPath)
		if err != nil {
			return err
		}
		if seen[at] {
			return nil
		}
		seen[at] = true
		b, err := os.ReadFile(hostPath) // follows links: the image gets the content
		if err != nil {
			return err
		}
		files = append(files, file{Path: at, Mode: 0o755, Data: b})
		return nil
	}
	for _, tool := range redisTools {
		p, err := exec.LookPath(tool)
		if err != nil {
			return nil, "", fmt.Errorf("finding %s: %w", tool, err)
		}
		if err := addHostFile(p); err != nil {
			return nil, "", err
		}
		libs, err := exec.Command("ldd", p).Output()
		if err != nil {
			return nil, "", fmt.Errorf("ldd %s: %w", p, err)
		}
		for _, m := range lddPath.FindAllStringSubmatch(string(libs), -1) {
			if err := addHostFile(m[1]); err != nil {
				return nil, "", err
			}
		}
	}
	for _, d := range mergedDirs {
		target, err := os.Readlink(d)
		if err == nil && !strings.HasPrefix(target, "/") {
			files = append(files, file{Path: d, Link: target})
		}
	}
	return files, version, nil
}

// canonical returns where a host file goes in the image: its directory
// with the links resolved (/lib/x86_64-linux-gnu becomes
// /usr/lib/x86_64-linux-gnu on a merged-/usr system), its own name kept
// (redis-server, not the redis-check-rdb it links to: Redis picks its mode
// from its name).
func canonical(p string) (string, error) {
	dir, err := filepath.EvalSymlinks(filepath.Dir(p))
	if err != nil {
		return "", fmt.Errorf("resolving %s: %w", p, err)
	}
	return filepath.Join(dir, filepath.Base(p)), nil
}
