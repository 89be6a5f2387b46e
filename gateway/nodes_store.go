package gateway

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"

	"github.com/execmesh/execmesh/internal/atomicfile"
)

// NodesFile is the pairing store in the gateway's state dir: every node an
// operator approved or rejected (and every node that joined by code), as
// JSON, replaced atomically on each change. Pending nodes are not stored:
// they announce themselves again.
const NodesFile = "nodes.json"

// storedNode is one decided node.
type storedNode struct {
	ID        string `json:"id"`
	PublicKey string `json:"publicKey,omitempty"` // empty for a node approved by id before it was seen
	Name      string `json:"name,omitempty"`
	Pairing   string `json:"pairing"` // paired or rejected
	// Joined: the node joined by code, so the embedded server must
	// accept its nkey (re-added after a gateway restart).
	Joined    bool  `json:"joined,omitempty"`
	DecidedAt int64 `json:"decidedAt"` // unix ms
}

type storeFile struct {
	Version int          `json:"version"`
	Nodes   []storedNode `json:"nodes"`
}

// nodeStore is the pairing store. It is read once and written through on
// every change; the mutex serialises writers.
type nodeStore struct {
	path string

	mu    sync.Mutex
	nodes map[string]storedNode
}

// openNodeStore loads <stateDir>/nodes.json (a missing file is empty).
func openNodeStore(stateDir string) (*nodeStore, error) {
	s := &nodeStore{path: filepath.Join(stateDir, NodesFile), nodes: map[string]storedNode{}}
	b, err := os.ReadFile(s.path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("node pairing store: %w", err)
	}
	var f storeFile
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("node pairing store %s: %w", s.path, err)
	}
	for _, n := range f.Nodes {
		if n.ID != "" {
			s.nodes[n.ID] = n
		}
	}
	return s, nil
}

// get returns the stored decision on id.
func (s *nodeStore) get(id string) (storedNode, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.nodes[id]
	return n, ok
}

// all returns every stored node.
func (s *nodeStore) all() []storedNode {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]storedNode, 0, len(s.nodes))
	for _, n := range s.nodes {
		out = append(out, n)
	}
	return out
}

// put stores n (replacing the entry of n.ID) and writes the file. On a
// write error the previous state is kept in memory too.
func (s *nodeStore) put(n storedNode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, had := s.nodes[n.ID]
	s.nodes[n.ID] = n
	if err := s.writeLocked(); err != nil {
		if had {
			s.nodes[n.ID] = old
		} else {
			delete(s.nodes, n.ID)
		}
		return err
	}
	return nil
}

func (s *nodeStore) writeLocked() error {
	f := storeFile{Version: 1, Nodes: make([]storedNode, 0, len(s.nodes))}
	for _, n := range s.nodes {
		f.Nodes = append(f.Nodes, n)
	}
	slices.SortFunc(f.Nodes, func(a, b storedNode) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.Write(s.path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("node pairing store: %w", err)
	}
	return nil
}
