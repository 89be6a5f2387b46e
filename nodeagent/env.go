package nodeagent

import (
	"os"
	"path/filepath"
	"strings"
)

// which finds bins on the node's own PATH, as OpenClaw's system.which:
// names with a path separator are skipped, and so are binaries not found.
func (a *Agent) which(bins []string) map[string]string {
	out := make(map[string]string, len(bins))
	for _, name := range bins {
		if name == "" || strings.ContainsRune(name, '/') || strings.ContainsRune(name, filepath.Separator) {
			continue
		}
		for dir := range strings.SplitSeq(a.ownPath, string(filepath.ListSeparator)) {
			if dir == "" || !filepath.IsAbs(dir) {
				continue
			}
			p := filepath.Join(dir, name)
			if st, err := os.Stat(p); err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0 {
				out[name] = p
				break
			}
		}
	}
	return out
}
