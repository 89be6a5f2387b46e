package approvals

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// FileName is the approvals file's name inside the state directory.
const FileName = "exec-approvals.json"

// maxFileSize bounds what Load reads; a larger file is refused as corrupt.
const maxFileSize = 16 << 20

// Errors callers branch on.
var (
	// ErrConflict: the file changed since it was loaded (Save's base hash
	// no longer matches). Load again, reapply, save again.
	ErrConflict = errors.New("approvals file changed since it was read")
	// ErrUnsafePath: the approvals file is a symbolic link, has other hard
	// links, or is not a regular file. It is neither read nor replaced.
	ErrUnsafePath = errors.New("unsafe approvals file")
	// ErrCorrupt: the file is not valid JSON or not version 1. It loads as
	// an empty policy and Save refuses to replace it, so a typo in a hand
	// edited file is never silently overwritten.
	ErrCorrupt = errors.New("invalid approvals file")
	// ErrNotAllowable: AddAllowAlways refuses the path (not absolute,
	// contains glob characters, or names a shell, wrapper or carrier).
	ErrNotAllowable = errors.New("path cannot be allowlisted")
)

// File is the exec-approvals file, in OpenClaw's format (version 1).
//
// Settings values are kept as written, even when invalid: an invalid value
// for an agent means "use the defaults" (not the "*" agent), and keeping it
// keeps that meaning across saves. Use Resolve to read the effective policy.
type File struct {
	Version  int               `json:"version"`
	Socket   *Socket           `json:"socket,omitempty"`
	Defaults *Settings         `json:"defaults,omitempty"`
	Agents   map[string]*Agent `json:"agents"`
}

// Socket is the approvals socket section, kept for OpenClaw compatibility.
type Socket struct {
	Path  string `json:"path,omitempty"`
	Token string `json:"token,omitempty"`
}

// Settings are the policy fields of the defaults and of each agent.
type Settings struct {
	Security        string `json:"security,omitempty"`
	Ask             string `json:"ask,omitempty"`
	AskFallback     string `json:"askFallback,omitempty"`
	AutoAllowSkills *bool  `json:"autoAllowSkills,omitempty"`
}

// Agent is one entry of the agents map: "*" applies to every agent.
type Agent struct {
	Settings
	Allowlist []Entry `json:"allowlist,omitempty"`
}

// Entry is one allowlist entry: a glob over resolved executable paths.
type Entry struct {
	ID      string `json:"id,omitempty"`
	Pattern string `json:"pattern"`
	// ArgPattern is kept for OpenClaw compatibility; execmesh does not bind
	// arguments, and an entry with an ArgPattern never matches.
	ArgPattern       string `json:"argPattern,omitempty"`
	Source           string `json:"source,omitempty"`
	LastUsedAt       int64  `json:"lastUsedAt,omitempty"` // Unix milliseconds
	LastUsedCommand  string `json:"lastUsedCommand,omitempty"`
	LastResolvedPath string `json:"lastResolvedPath,omitempty"`
}

// NewFile returns an empty approvals file.
func NewFile() *File {
	return &File{Version: 1, Agents: map[string]*Agent{}}
}

// Path returns the approvals file path in a state directory.
func Path(stateDir string) string { return filepath.Join(stateDir, FileName) }

// Hash returns the content hash Load and Save use: the lower-case hex
// SHA-256 of the raw bytes. A missing file's hash is "".
func Hash(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// Load reads the approvals file. It always returns a usable *File:
//
//   - missing file: empty file, hash "", nil error;
//   - invalid JSON or version other than 1: empty file, the hash of the
//     bytes, an error wrapping ErrCorrupt (log it; the file is not touched);
//   - symbolic link, hard-linked or not a regular file: empty file, hash "",
//     an error wrapping ErrUnsafePath;
//   - otherwise the normalised file and its hash, for Save.
func Load(path string) (*File, string, error) {
	data, err := readFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return NewFile(), "", nil
	}
	if err != nil {
		return NewFile(), "", fmt.Errorf("load %s: %w", path, err)
	}
	hash := Hash(data)
	f, err := Parse(data)
	if err != nil {
		return f, hash, fmt.Errorf("load %s: %w", path, err)
	}
	return f, hash, nil
}

// readAttempts bounds how often readFile starts again when path was
// replaced between its Lstat and its open. Every Save renames a new file
// into place, so a reader racing a writer sees a different file now and
// then; only a path that keeps changing under the reader is refused.
const readAttempts = 5

// errReplaced is readFileOnce's report of a path replaced while it was
// being opened.
var errReplaced = fmt.Errorf("%w: changed while it was opened", ErrUnsafePath)

// readFile reads path refusing symbolic links and hard-linked files, with
// checks both before and after opening so that a swap in between is seen.
func readFile(path string) (data []byte, err error) {
	for range readAttempts {
		if data, err = readFileOnce(path); !errors.Is(err, errReplaced) {
			break
		}
	}
	return data, err
}

func readFileOnce(path string) ([]byte, error) {
	fi, err := os.Lstat(path)
	if err != nil {
		return nil, err
	}
	if err := safeFileInfo(path, fi); err != nil {
		return nil, err
	}
	f, err := openForRead(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	fi2, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !os.SameFile(fi, fi2) {
		return nil, fmt.Errorf("%s: %w", path, errReplaced)
	}
	if err := safeFileInfo(path, fi2); err != nil {
		return nil, err
	}
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, err
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%w: larger than %d bytes", ErrCorrupt, maxFileSize)
	}
	return data, nil
}

// openForRead opens path for reading without following a symbolic link
// and without waiting: a FIFO put in its place after the Lstat check
// would otherwise block the open until a writer came. What was opened is
// checked by the caller.
func openForRead(path string) (*os.File, error) {
	return os.OpenFile(path, os.O_RDONLY|oNoFollow|oNonBlock, 0)
}

func safeFileInfo(path string, fi fs.FileInfo) error {
	switch {
	case fi.Mode()&fs.ModeSymlink != 0:
		return fmt.Errorf("%w: %s is a symbolic link", ErrUnsafePath, path)
	case !fi.Mode().IsRegular():
		return fmt.Errorf("%w: %s is not a regular file", ErrUnsafePath, path)
	}
	if n := linkCount(fi); n > 1 {
		return fmt.Errorf("%w: %s has %d hard links", ErrUnsafePath, path, n)
	}
	return nil
}

// Parse decodes approvals-file JSON leniently, as OpenClaw does: fields of
// the wrong type are ignored, string allowlist items become {pattern},
// items without a pattern are dropped, missing ids get random UUIDs,
// commandText is stripped, and agents.default is merged into agents.main
// (main's fields win; allowlists are concatenated without duplicates).
// Invalid JSON or a version other than 1 gives an empty file and an error
// wrapping ErrCorrupt.
func Parse(data []byte) (*File, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return NewFile(), fmt.Errorf("%w: %v", ErrCorrupt, err)
	}
	var version float64
	if err := json.Unmarshal(raw["version"], &version); err != nil || version != 1 {
		return NewFile(), fmt.Errorf("%w: version %s is not 1", ErrCorrupt, bytes.TrimSpace(raw["version"]))
	}
	f := NewFile()
	if obj, ok := object(raw["socket"]); ok {
		s := &Socket{Path: strings.TrimSpace(str(obj["path"])), Token: strings.TrimSpace(str(obj["token"]))}
		if s.Path != "" || s.Token != "" {
			f.Socket = s
		}
	}
	if obj, ok := object(raw["defaults"]); ok {
		s := parseSettings(obj)
		if s != (Settings{}) {
			f.Defaults = &s
		}
	}
	if agents, ok := object(raw["agents"]); ok {
		for id, v := range agents {
			if obj, ok := object(v); ok {
				f.Agents[id] = parseAgent(obj)
			}
		}
	}
	if def, ok := f.Agents["default"]; ok {
		delete(f.Agents, "default")
		main := f.Agents["main"]
		if main == nil {
			main = &Agent{}
			f.Agents["main"] = main
		}
		if main.Security == "" {
			main.Security = def.Security
		}
		if main.Ask == "" {
			main.Ask = def.Ask
		}
		if main.AskFallback == "" {
			main.AskFallback = def.AskFallback
		}
		if main.AutoAllowSkills == nil {
			main.AutoAllowSkills = def.AutoAllowSkills
		}
		seen := map[string]bool{}
		var merged []Entry
		for _, e := range append(main.Allowlist, def.Allowlist...) {
			k := strings.ToLower(e.Pattern) + "\x00" + e.ArgPattern
			if !seen[k] {
				seen[k] = true
				merged = append(merged, e)
			}
		}
		main.Allowlist = merged
	}
	return f, nil
}

func object(v json.RawMessage) (map[string]json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if len(v) == 0 || json.Unmarshal(v, &m) != nil || m == nil {
		return nil, false
	}
	return m, true
}

func str(v json.RawMessage) string {
	var s string
	if len(v) == 0 || json.Unmarshal(v, &s) != nil {
		return ""
	}
	return s
}

func parseSettings(obj map[string]json.RawMessage) Settings {
	s := Settings{
		Security:    strings.TrimSpace(str(obj["security"])),
		Ask:         strings.TrimSpace(str(obj["ask"])),
		AskFallback: strings.TrimSpace(str(obj["askFallback"])),
	}
	var b bool
	if v := obj["autoAllowSkills"]; len(v) > 0 && json.Unmarshal(v, &b) == nil {
		s.AutoAllowSkills = &b
	}
	return s
}

func parseAgent(obj map[string]json.RawMessage) *Agent {
	a := &Agent{Settings: parseSettings(obj)}
	var items []json.RawMessage
	if v := obj["allowlist"]; len(v) == 0 || json.Unmarshal(v, &items) != nil {
		return a
	}
	for _, item := range items {
		var e Entry
		var s string
		if json.Unmarshal(item, &s) == nil {
			e.Pattern = strings.TrimSpace(s)
		} else if m, ok := object(item); ok {
			e = Entry{
				ID:               strings.TrimSpace(str(m["id"])),
				Pattern:          strings.TrimSpace(str(m["pattern"])),
				ArgPattern:       str(m["argPattern"]),
				Source:           str(m["source"]),
				LastUsedCommand:  str(m["lastUsedCommand"]),
				LastResolvedPath: str(m["lastResolvedPath"]),
			}
			var at float64
			if v := m["lastUsedAt"]; len(v) > 0 && json.Unmarshal(v, &at) == nil {
				e.LastUsedAt = int64(at)
			}
		}
		if e.Pattern == "" {
			continue
		}
		if e.ID == "" {
			e.ID = newUUID()
		}
		a.Allowlist = append(a.Allowlist, e)
	}
	return a
}

// Marshal encodes the file as OpenClaw writes it: 2-space indented JSON with
// a trailing newline, version 1.
func (f *File) Marshal() ([]byte, error) {
	out := *f
	out.Version = 1
	if out.Agents == nil {
		out.Agents = map[string]*Agent{}
	}
	if out.Defaults != nil && *out.Defaults == (Settings{}) {
		out.Defaults = nil
	}
	if out.Socket != nil && *out.Socket == (Socket{}) {
		out.Socket = nil
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	if err := enc.Encode(&out); err != nil {
		return nil, fmt.Errorf("encode approvals: %w", err)
	}
	return buf.Bytes(), nil
}

// Save writes f to path if the file still has baseHash ("" = the file must
// not exist), and returns the new hash. Otherwise it returns an error
// wrapping ErrConflict and writes nothing. It also refuses (writing nothing)
// when the file on disk is a symbolic link or hard-linked (ErrUnsafePath) or
// does not parse (ErrCorrupt).
//
// The write is atomic: a 0600 temp file `.exec-approvals.<pid>.<random>.tmp`
// in the same directory, synced and renamed over path. The directory is
// created if needed and forced to 0700. Concurrent savers, in this process
// or another, are serialised by an advisory lock on a `.<name>.lock` file
// beside it, so the hash check and the rename happen as one step.
func Save(path string, f *File, baseHash string) (string, error) {
	data, err := f.Marshal()
	if err != nil {
		return "", err
	}
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "." // a bare file name: the working directory's mode is left alone
	} else {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return "", fmt.Errorf("save %s: %w", path, err)
		}
		if err := os.Chmod(dir, 0o700); err != nil {
			return "", fmt.Errorf("save %s: %w", path, err)
		}
	}
	unlock, err := lockFile(filepath.Join(dir, "."+base+".lock"))
	if err != nil {
		return "", fmt.Errorf("save %s: %w", path, err)
	}
	defer unlock()

	current := ""
	cur, err := readFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return "", fmt.Errorf("save %s: %w", path, err)
	default:
		current = Hash(cur)
		if _, perr := Parse(cur); perr != nil {
			return "", fmt.Errorf("save %s: refusing to replace an unreadable file: %w", path, perr)
		}
	}
	if current != baseHash {
		return "", fmt.Errorf("save %s: %w", path, ErrConflict)
	}

	tmp := filepath.Join(dir, fmt.Sprintf(".%s.%d.%s.tmp", strings.TrimSuffix(base, ".json"), os.Getpid(), randomHex(8)))
	if err := writeFileSync(tmp, data); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("save %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("save %s: %w", path, err)
	}
	syncDir(dir)
	return Hash(data), nil
}

func writeFileSync(name string, data []byte) error {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|oNoFollow, 0o600)
	if err != nil {
		return err
	}
	// The umask can only remove bits; Chmod makes the mode exact.
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncDir makes the rename durable; failure only weakens durability.
func syncDir(dir string) {
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
}

// Update loads path, applies fn and saves, retrying a few times when another
// writer got in between (ErrConflict). It refuses to start from an unsafe or
// corrupt file: fn is not called and the file is left as it is.
func Update(path string, fn func(*File) error) (string, error) {
	var err error
	for range 5 {
		f, hash, lerr := Load(path)
		if lerr != nil {
			return "", lerr
		}
		if ferr := fn(f); ferr != nil {
			return "", ferr
		}
		var h string
		h, err = Save(path, f, hash)
		if !errors.Is(err, ErrConflict) {
			return h, err
		}
	}
	return "", err
}

// Resolve returns the effective policy of an agent ("" means "main").
// Each of security, ask and askFallback comes from the agent's own value if
// present and valid; a present but invalid value falls back to the defaults
// (not to "*"); an absent one to the "*" agent's value if present and
// valid; then to the file's defaults if valid; then to the given defaults.
// The allowlist is the "*" entries followed by the agent's.
func (f *File) Resolve(agentID string, defaults Policy) Policy {
	if agentID == "" {
		agentID = "main"
	}
	agent, star := f.Agents[agentID], f.Agents["*"]
	if agentID == "*" {
		agent = nil
	}
	pick := func(get func(*Settings) string, norm func(string) (string, bool), def string) string {
		base := def
		if f.Defaults != nil {
			if v, ok := norm(get(f.Defaults)); ok {
				base = v
			}
		}
		for _, a := range []*Agent{agent, star} {
			if a == nil || get(&a.Settings) == "" {
				continue
			}
			if v, ok := norm(get(&a.Settings)); ok {
				return v
			}
			return base
		}
		return base
	}
	p := Policy{
		Security:    pick(func(s *Settings) string { return s.Security }, NormalizeSecurity, defaults.Security),
		Ask:         pick(func(s *Settings) string { return s.Ask }, NormalizeAsk, defaults.Ask),
		AskFallback: pick(func(s *Settings) string { return s.AskFallback }, NormalizeSecurity, defaults.AskFallback),
	}
	if star != nil {
		p.Allowlist = append(p.Allowlist, star.Allowlist...)
	}
	if agent != nil {
		p.Allowlist = append(p.Allowlist, agent.Allowlist...)
	}
	return p
}

// AddAllowAlways records an "allow-always" decision for an agent ("" means
// "main"): an entry whose pattern is the resolved executable path, source
// "allow-always". Pass the paths of Evaluation.AllowAlwaysPaths; a shell,
// dispatch wrapper, carrier or privilege tool is refused with
// ErrNotAllowable, so approving `zsh -lc whoami` can never allowlist zsh.
// An existing entry with the same pattern is returned instead of a
// duplicate. The caller saves the file.
func (f *File) AddAllowAlways(agentID, resolvedPath string) (Entry, error) {
	if agentID == "" {
		agentID = "main"
	}
	switch {
	case !filepath.IsAbs(resolvedPath) || filepath.Clean(resolvedPath) != resolvedPath:
		return Entry{}, fmt.Errorf("%w: %q is not a clean absolute path", ErrNotAllowable, resolvedPath)
	case strings.ContainsAny(resolvedPath, "*?"):
		return Entry{}, fmt.Errorf("%w: %q contains glob characters", ErrNotAllowable, resolvedPath)
	}
	if kind := unsafeKind(filepath.Base(resolvedPath)); kind != "" {
		return Entry{}, fmt.Errorf("%w: %s is a %s", ErrNotAllowable, resolvedPath, kind)
	}
	if f.Agents == nil {
		f.Agents = map[string]*Agent{}
	}
	a := f.Agents[agentID]
	if a == nil {
		a = &Agent{}
		f.Agents[agentID] = a
	}
	for _, e := range a.Allowlist {
		if strings.EqualFold(e.Pattern, resolvedPath) && e.ArgPattern == "" {
			return e, nil
		}
	}
	e := Entry{ID: newUUID(), Pattern: resolvedPath, Source: "allow-always", LastResolvedPath: resolvedPath}
	a.Allowlist = append(a.Allowlist, e)
	return e, nil
}

// RecordUse notes, on the allowlist entries that satisfied ev's segments
// (in the agent's list or in "*"), when they were last used, by which
// command and for which resolved path. It returns how many entries changed;
// the caller saves the file.
func (f *File) RecordUse(agentID string, ev Evaluation, command string, at time.Time) int {
	if agentID == "" {
		agentID = "main"
	}
	n := 0
	for _, r := range ev.Segments {
		if r.SatisfiedBy != ByAllowlist || r.EntryID == "" {
			continue
		}
		for _, id := range []string{agentID, "*"} {
			a := f.Agents[id]
			if a == nil {
				continue
			}
			for i := range a.Allowlist {
				if a.Allowlist[i].ID == r.EntryID {
					a.Allowlist[i].LastUsedAt = at.UnixMilli()
					a.Allowlist[i].LastUsedCommand = command
					a.Allowlist[i].LastResolvedPath = r.ResolvedPath
					n++
				}
			}
		}
	}
	return n
}

// newUUID returns a random (version 4) UUID.
func newUUID() string {
	var b [16]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails (Go 1.24+)
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
