// Command images builds floodgate's container images without Docker and
// writes each as an OCI image archive (an OCI layout in a tar, that also
// carries `docker save`'s manifest.json) under -out, for `make images`:
//
//   - floodgate-manager and floodgate-sidecar: the static binaries on an
//     empty base, as the Dockerfile's stages build them on distroless
//     static (the same paths, user 65532:65532, entrypoint, /etc/passwd,
//     /tmp and CA certificates);
//   - floodgate-redis: Debian's redis-server and redis-cli with the shared
//     libraries they link, and the sh, rm, grep and awk of the managed
//     store's start script and probes, running as the redis user 999;
//   - floodgate-sample-backend: the sample application of the README;
//   - floodgate-pause: the pod sandbox process for nodes that cannot pull
//     registry.k8s.io/pause.
//
// Every image is named ghcr.io/floodgate-dev/<name>:<appVersion of the
// chart>, the name a release publishes and the chart's values use. Layers
// and archives are reproducible: every file time is the time of the HEAD
// commit ($SOURCE_DATE_EPOCH when set), so the same tree gives the same
// digests.
//
// Usage: go run ./hack/images [-out bin/images] [-only name,...]
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"sigs.k8s.io/yaml"
)

// Registry is where a release publishes floodgate's images.
const Registry = "ghcr.io/floodgate-dev"

// Names of the images.
const (
	managerImage       = "floodgate-manager"
	sidecarImage       = "floodgate-sidecar"
	redisImage         = "floodgate-redis"
	sampleBackendImage = "floodgate-sample-backend"
	pauseImage         = "floodgate-pause"
)

// Users of the images.
const (
	// nonRoot is distroless's "nonroot" user, which the manager, the
	// sidecar and the sample backend run as.
	nonRoot = 65532
	// redisUser is the redis user of the official Redis image, which the
	// managed store's pods run as.
	redisUser = 999
	// pauseUser is the user of Kubernetes' pause image.
	pauseUser = 65535
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func run() error {
	out := flag.String("out", "bin/images", "directory the archives are written to")
	only := flag.String("only", "", "comma-separated names of the images to build (default: all)")
	chart := flag.String("chart", "charts/floodgate/Chart.yaml", "the chart whose appVersion tags the images")
	flag.Parse()

	version, err := appVersion(*chart)
	if err != nil {
		return err
	}
	created, err := sourceDate()
	if err != nil {
		return err
	}
	names := []string{managerImage, sidecarImage, redisImage, sampleBackendImage, pauseImage}
	if *only != "" {
		want := strings.Split(*only, ",")
		for _, n := range want {
			if !slices.Contains(names, n) {
				return fmt.Errorf("-only: unknown image %q; known: %s", n, strings.Join(names, ", "))
			}
		}
		names = want
	}
	bins, err := os.MkdirTemp("", "floodgate-images-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(bins) }()
	if err := goBuild(bins); err != nil {
		return err
	}
	if err := os.MkdirAll(*out, 0o755); err != nil {
		return err
	}
	for _, name := range names {
		start := time.Now()
		spec, err := specFor(name, version, bins, created)
		if err != nil {
			return err
		}
		img, err := build(spec, runtime.GOARCH, created)
		if err != nil {
			return err
		}
		path := filepath.Join(*out, name+".tar")
		if err := writeFile(path, func(f *os.File) error { return writeArchive(f, img, spec.Ref, created) }); err != nil {
			return err
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		st, err := os.Stat(path)
		if err != nil {
			return err
		}
		fmt.Printf("%-58s %s  %5.1f MB  %s (%s)\n", spec.Ref, digest.String()[:19], float64(st.Size())/1e6, path, time.Since(start).Round(time.Millisecond))
	}
	return nil
}

// writeFile writes path through a temporary file renamed into place, so a
// failed build never leaves a truncated archive behind.
func writeFile(path string, write func(*os.File) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-"+filepath.Base(path))
	if err != nil {
		return err
	}
	defer func() { _ = os.Remove(tmp.Name()) }()
	if err := write(tmp); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

// appVersion reads the chart's appVersion.
func appVersion(chartFile string) (string, error) {
	b, err := os.ReadFile(chartFile)
	if err != nil {
		return "", fmt.Errorf("reading the chart: %w", err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil {
		return "", fmt.Errorf("%s: %w", chartFile, err)
	}
	if c.AppVersion == "" {
		return "", fmt.Errorf("%s: appVersion is empty", chartFile)
	}
	return c.AppVersion, nil
}

// sourceDate is $SOURCE_DATE_EPOCH, else the HEAD commit's time.
func sourceDate() (time.Time, error) {
	v := os.Getenv("SOURCE_DATE_EPOCH")
	if v == "" {
		out, err := exec.Command("git", "log", "-1", "--format=%ct").Output()
		if err != nil {
			return time.Time{}, fmt.Errorf("reading the HEAD commit's time (or set SOURCE_DATE_EPOCH): %w", err)
		}
		v = strings.TrimSpace(string(out))
	}
	sec, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("source date %q: %w", v, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

// goBuild builds the static binaries into dir.
func goBuild(dir string) error {
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w", "-o", dir+"/",
		"./cmd/floodgate-manager", "./cmd/floodgate-sidecar", "./hack/images/samplebackend", "./hack/images/pause")
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux")
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("go build: %w", err)
	}
	return nil
}

// labels returns the OCI annotations users expect on an image.
func labels(title, description, version string, created time.Time) map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       title,
		"org.opencontainers.image.description": description,
		"org.opencontainers.image.version":     version,
		"org.opencontainers.image.created":     created.Format(time.RFC3339),
		"org.opencontainers.image.source":      "https://github.com/floodgate-dev/floodgate",
		"org.opencontainers.image.url":         "https://github.com/floodgate-dev/floodgate",
		"org.opencontainers.image.licenses":    "Apache-2.0",
		"org.opencontainers.image.vendor":      "floodgate",
	}
	if rev, err := exec.Command("git", "rev-parse", "HEAD").Output(); err == nil {
		l["org.opencontainers.image.revision"] = strings.TrimSpace(string(rev))
	}
	return l
}

// baseFiles are what distroless/static gives a static binary: the root and
// nonroot users, a world-writable /tmp, the nonroot home and the CA
// certificates (for a store reached over TLS with the system roots).
func baseFiles() ([]file, error) {
	certs, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
	if err != nil {
		return nil, fmt.Errorf("reading the CA certificates (apt-get install ca-certificates): %w", err)
	}
	return []file{
		{Path: "/etc/passwd", Mode: 0o644, Data: []byte("root:x:0:0:root:/root:/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n")},
		{Path: "/etc/group", Mode: 0o644, Data: []byte("root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n")},
		{Path: "/etc/nsswitch.conf", Mode: 0o644, Data: []byte("hosts: files dns\n")},
		{Path: "/tmp", Dir: true, Mode: 0o1777},
		{Path: "/home/nonroot", Dir: true, Mode: 0o700, UID: nonRoot, GID: nonRoot},
		{Path: "/etc/ssl/certs/ca-certificates.crt", Mode: 0o644, Data: certs},
	}, nil
}

// binaries maps an image to the binaries it holds: the go build output
// name and the path in the image.
var binaries = map[string][][2]string{
	// The sidecar binary rides along in the manager image, as in the
	// Dockerfile.
	managerImage:       {{"floodgate-manager", "/floodgate-manager"}, {"floodgate-sidecar", "/floodgate-sidecar"}},
	sidecarImage:       {{"floodgate-sidecar", "/floodgate-sidecar"}},
	sampleBackendImage: {{"samplebackend", "/floodgate-sample-backend"}},
	pauseImage:         {{"pause", "/pause"}},
}

// specFor returns the spec of the image name.
func specFor(name, version, bins string, created time.Time) (imageSpec, error) {
	s := imageSpec{Name: name, Ref: Registry + "/" + name + ":" + version}
	path := "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	env := []string{path, "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"}
	nonRootUser := fmt.Sprintf("%d:%d", nonRoot, nonRoot)
	switch name {
	case managerImage:
		s.Config = runConfig(nonRootUser, []string{"/floodgate-manager"}, env, nil,
			labels(name, "floodgate's operator: policy and CounterStore controllers, sidecar injector and policy validation webhooks", version, created))
	case sidecarImage:
		s.Config = runConfig(nonRootUser, []string{"/floodgate-sidecar"}, env, []string{"15080/tcp", "9090/tcp"},
			labels(name, "floodgate's rate-limiting proxy, injected next to each opted-in pod's application", version, created))
	case sampleBackendImage:
		s.Config = runConfig(nonRootUser, []string{"/floodgate-sample-backend"}, env, []string{"8080/tcp", "8081/tcp"},
			labels(name, "floodgate's sample application: answers 200 and counts the requests it receives (/hits on port 8081)", version, created))
	case pauseImage:
		s.Config = runConfig(fmt.Sprintf("%d:%d", pauseUser, pauseUser), []string{"/pause"}, nil, nil,
			labels(name, "the pod sandbox process, for nodes that cannot pull registry.k8s.io/pause", version, created))
	case redisImage:
		files, redisVersion, err := redisFiles()
		if err != nil {
			return s, err
		}
		l := labels(name, "Redis "+redisVersion+" from Debian's redis-server package, for floodgate's managed CounterStore", version, created)
		l["dev.floodgate.redis.version"] = redisVersion
		l["dev.floodgate.redis.debian-package"] = debianVersion("redis-server")
		s.Files = files
		s.Config = runConfig(fmt.Sprintf("%d:%d", redisUser, redisUser), []string{"redis-server"}, []string{path}, []string{"6379/tcp", "16379/tcp"}, l)
		s.Config.WorkingDir = "/data"
		return s, nil
	default:
		return s, fmt.Errorf("unknown image %q", name)
	}
	if name != pauseImage {
		base, err := baseFiles()
		if err != nil {
			return s, err
		}
		s.Files = base
	}
	for _, b := range binaries[name] {
		data, err := os.ReadFile(filepath.Join(bins, b[0]))
		if err != nil {
			return s, err
		}
		s.Files = append(s.Files, file{Path: b[1], Mode: 0o755, Data: data})
	}
	return s, nil
}

// runConfig returns an image's run configuration.
func runConfig(user string, entrypoint, env, ports []string, labels map[string]string) v1.Config {
	c := v1.Config{User: user, Entrypoint: entrypoint, Env: env, Labels: labels}
	if len(ports) > 0 {
		c.ExposedPorts = map[string]struct{}{}
		for _, p := range ports {
			c.ExposedPorts[p] = struct{}{}
		}
	}
	return c
}

// debianVersion returns the installed version of a Debian package, or
// "unknown".
func debianVersion(pkg string) string {
	out, err := exec.Command("dpkg-query", "-W", "-f=${Version}", pkg).Output()
	if err != nil {
		return "unknown"
	}
	return string(bytes.TrimSpace(out))
}
