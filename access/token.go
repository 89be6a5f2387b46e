package access

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/execmesh/execmesh/internal/atomicfile"
)

// OperatorTokenFile is the file in the state dir that holds the operator
// token the gateway generates when gateway.auth.operatorToken is unset:
// the token on one line, mode 0600, readable by the daemon's user only.
// The CLI reads it for operator commands; the control page asks for it.
const OperatorTokenFile = "operator.token"

// minOperatorTokenLen is the shortest token the file may hold: a shorter
// one was not written by the gateway (64 hex characters).
const minOperatorTokenLen = 32

// ReadOperatorTokenFile returns the token in <stateDir>/operator.token. A
// file that is not a regular file of this user, or that group or others
// may read or write, is refused: its token may be known to others.
func ReadOperatorTokenFile(stateDir string) (string, error) {
	path := filepath.Join(stateDir, OperatorTokenFile)
	fi, err := os.Lstat(path)
	if err != nil {
		return "", err
	}
	if !fi.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	if fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("%s has mode %04o: others may read it (want 0600)", path, fi.Mode().Perm())
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Geteuid() {
		return "", fmt.Errorf("%s belongs to uid %d, not to this user", path, st.Uid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	tok := strings.TrimSpace(string(b))
	if len(tok) < minOperatorTokenLen || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("%s does not hold an operator token", path)
	}
	return tok, nil
}

// LoadOrCreateOperatorToken returns the token of <stateDir>/operator.token,
// creating the file with a fresh random token when it is missing, and
// replacing it when it cannot be trusted (see ReadOperatorTokenFile):
// refused is that reason, for the log.
func LoadOrCreateOperatorToken(stateDir string) (tok string, refused error, err error) {
	tok, refused = ReadOperatorTokenFile(stateDir)
	if refused == nil {
		return tok, nil, nil
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", nil, fmt.Errorf("operator token: %w", err)
	}
	tok = hex.EncodeToString(b[:])
	path := filepath.Join(stateDir, OperatorTokenFile)
	if errors.Is(refused, fs.ErrNotExist) {
		refused = nil
		// Create-once: of two processes starting on one state dir, the
		// first one's token stands.
		if err := atomicfile.WriteNew(path, []byte(tok+"\n"), 0o600); err != nil {
			if errors.Is(err, fs.ErrExist) {
				tok, err = ReadOperatorTokenFile(stateDir)
				return tok, nil, err
			}
			return "", nil, fmt.Errorf("operator token: %w", err)
		}
		return tok, nil, nil
	}
	if fi, err := os.Lstat(path); err == nil && fi.IsDir() {
		return "", nil, fmt.Errorf("operator token: %w", refused)
	}
	if err := atomicfile.Write(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", nil, fmt.Errorf("operator token: %w", err)
	}
	return tok, refused, nil
}
