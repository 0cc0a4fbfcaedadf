package formation

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// EnsureLibrary loads the Redis Functions library src, named name, on every
// node of masters that lacks it (FUNCTION LIST LIBRARYNAME, then FUNCTION
// LOAD). Replicas follow their master's functions by replication and
// refuse FUNCTION LOAD (READONLY), which is no error: any node may be
// given. Other libraries are left alone. It returns the addresses it loaded the library
// on, and joins an error per node it could not check or load.
func (s *Session) EnsureLibrary(ctx context.Context, masters []string, name, src string) ([]string, error) {
	var (
		mu     sync.Mutex
		loaded []string
		errs   []error
		wg     sync.WaitGroup
	)
	sem := make(chan struct{}, observeParallelism)
	for _, addr := range masters {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			did, err := s.ensureLibrary(ctx, addr, name, src)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, fmt.Errorf("library %s on %s: %w", name, addr, err))
			}
			if did {
				loaded = append(loaded, addr)
			}
		})
	}
	wg.Wait()
	slices.Sort(loaded)
	return loaded, errors.Join(errs...)
}

func (s *Session) ensureLibrary(ctx context.Context, addr, name, src string) (bool, error) {
	ctx, cancel := context.WithTimeout(ctx, s.d.timeout())
	defer cancel()
	c := s.client(addr)
	libs, err := c.FunctionList(ctx, redis.FunctionListQuery{LibraryNamePattern: name}).Result()
	if err != nil {
		return false, err
	}
	for _, l := range libs {
		if l.Name == name {
			return false, nil
		}
	}
	if err := c.FunctionLoad(ctx, src).Err(); err != nil {
		switch {
		case strings.Contains(err.Error(), "already exists"):
			return false, nil // loaded meanwhile
		case strings.HasPrefix(err.Error(), "READONLY"):
			return false, nil // a replica: it follows its master
		}
		return false, err
	}
	return true, nil
}
