package approvals

import "strings"

// Quote single-quotes s for a POSIX shell: 'x', with each embedded quote
// written as '"'"'. The result is always one word with no expansion.
func Quote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'"'"'`) + "'"
}

// Render turns an execution plan into one shell command: every word quoted
// with Quote, words joined by spaces, segments joined by " | ".
func Render(plan [][]string) string {
	segs := make([]string, len(plan))
	for i, argv := range plan {
		words := make([]string, len(argv))
		for j, a := range argv {
			words[j] = Quote(a)
		}
		segs[i] = strings.Join(words, " ")
	}
	return strings.Join(segs, " | ")
}
