package integration

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode"
)

// README.md's code blocks follow one convention, which TestREADME holds
// the file to: a block fenced as ```sh is a command a user types against
// a running `execmesh up`, and the test runs every such block, in order,
// against the real binary; ```console, ```text and ```json blocks are
// shown only (a daemon in the foreground, another machine, a client
// that is not installed here, output). Any other fence, a bare ``` or
// ```bash included, fails the test, so no shell block is skipped
// without saying so.

// readmeDefaultListen is the gateway address README.md writes; the test
// runs the blocks against its own daemon's address instead.
const readmeDefaultListen = "127.0.0.1:8420"

// readmeShownOnly are the info strings of blocks the test does not run.
var readmeShownOnly = map[string]bool{"console": true, "text": true, "json": true}

// readmeBlock is one ```sh block: its first line's number in the file
// (of the line after the fence) and its text.
type readmeBlock struct {
	line int
	text string
}

// readmeShellBlocks returns the ```sh blocks of a Markdown text in order,
// or an error naming the line of a fence the convention does not know or
// of a block that is never closed.
func readmeShellBlocks(md string) ([]readmeBlock, error) {
	var (
		blocks []readmeBlock
		cur    *strings.Builder
		kind   string
		start  int
	)
	sc := bufio.NewScanner(strings.NewReader(md))
	sc.Buffer(make([]byte, 0, 64*1024), 1024*1024)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		fence := strings.HasPrefix(strings.TrimLeft(line, " "), "```")
		switch {
		case cur == nil && fence:
			kind = strings.TrimSpace(strings.TrimLeft(strings.TrimSpace(line), "`"))
			if kind != "sh" && !readmeShownOnly[kind] {
				return nil, fmt.Errorf("line %d: a code block fenced as %q: use ```sh for commands the README test runs, ```console or ```text for ones it must not run, ```json for data", n, line)
			}
			cur, start = &strings.Builder{}, n+1
		case cur != nil && fence:
			if strings.TrimSpace(line) != "```" {
				return nil, fmt.Errorf("line %d: %q opens a block inside the block of line %d", n, line, start-1)
			}
			if kind == "sh" {
				blocks = append(blocks, readmeBlock{line: start, text: cur.String()})
			}
			cur = nil
		case cur != nil:
			cur.WriteString(line)
			cur.WriteByte('\n')
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: the code block opened there is never closed", start-1)
	}
	return blocks, nil
}

// readmeScript joins the blocks into one bash script run with -e, so a
// variable one block sets is there for the next, as in the user's shell;
// when a command fails, the script names the block it was in.
func readmeScript(blocks []readmeBlock, listen string) string {
	var b strings.Builder
	b.WriteString("set -euo pipefail\nREADME_LINE=0\n")
	b.WriteString(`trap 'rc=$?; [ "$rc" = 0 ] || echo "README test: exit $rc in the sh block at README.md:$README_LINE" >&2' EXIT` + "\n")
	b.WriteString("set -x\n")
	for _, bl := range blocks {
		fmt.Fprintf(&b, "README_LINE=%d\n", bl.line)
		b.WriteString(strings.ReplaceAll(bl.text, readmeDefaultListen, listen))
	}
	return b.String()
}

func TestReadmeShellBlocks(t *testing.T) {
	cases := []struct {
		name    string
		md      string
		want    []readmeBlock
		wantErr string
	}{
		{
			name: "sh blocks run in order, the others are shown only",
			md:   "# x\n```sh\na\nb\n```\n```console\n$ up\n```\n```text\nc\n```\n```json\n{}\n```\n```sh\nd\n```\n",
			want: []readmeBlock{{line: 3, text: "a\nb\n"}, {line: 16, text: "d\n"}},
		},
		{name: "a bare fence", md: "```\nls\n```\n", wantErr: "line 1: a code block fenced as \"```\""},
		{name: "bash is not sh", md: "text\n```bash\nls\n```\n", wantErr: "line 2: a code block fenced as \"```bash\""},
		{name: "never closed", md: "```sh\nls\n", wantErr: "line 1: the code block opened there is never closed"},
		{name: "a fence inside a block", md: "```sh\nls\n```text\n```\n", wantErr: "line 3: \"```text\" opens a block inside the block of line 1"},
		{name: "no blocks", md: "just text\n", want: nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := readmeShellBlocks(tc.md)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) {
				t.Fatalf("blocks = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestREADME runs every ```sh block of README.md, in order, in one bash
// process, against a real `execmesh up` started as the README's quick
// start says (a fresh HOME, so ~/.execmesh is the daemon's state dir),
// with the built binary first on PATH; any command that exits non-zero
// fails the test with the block's line. Background processes a block
// starts (a joined node) are ended with the script's process group.
func TestREADME(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the README's commands against a real daemon; not in -short")
	}
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	md, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := readmeShellBlocks(string(md))
	if err != nil {
		t.Fatalf("README.md: %v", err)
	}
	if len(blocks) == 0 {
		t.Fatal("README.md has no ```sh block: nothing of it is checked")
	}
	for _, tool := range []string{"bash", "curl", "jq"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("the README's commands need %s (scripts/ensure-deps.sh installs it): %v", tool, err)
		}
	}
	bin, err := execmeshBinary()
	if err != nil {
		t.Fatal(err)
	}
	pathDir := t.TempDir()
	if err := os.Symlink(bin, filepath.Join(pathDir, "execmesh")); err != nil {
		t.Fatal(err)
	}

	home := t.TempDir()
	d := startBareDaemon(t, "up", filepath.Join(home, ".execmesh"), home)
	listen := strings.TrimPrefix(d.url, "http://")

	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := exec.Command("bash", "-c", readmeScript(blocks, listen))
	cmd.Dir = home
	cmd.Env = cleanEnv(map[string]string{
		"HOME":                 home,
		"PATH":                 pathDir + string(os.PathListSeparator) + os.Getenv("PATH"),
		"EXECMESH_GATEWAY_URL": d.url,
	})
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	// Files, not buffers: a node a block left running holds its copy of
	// stdout, and Wait must not wait for it.
	out, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { endProcessGroup(pgid) })
	stop := context.AfterFunc(ctx, func() { _ = syscall.Kill(-pgid, syscall.SIGKILL) })
	defer stop()
	err = cmd.Wait()
	endProcessGroup(pgid)
	if err != nil {
		log, _ := os.ReadFile(out.Name())
		if ctx.Err() != nil {
			err = fmt.Errorf("%w (killed after %v: a command waited too long)", err, 90*time.Second)
		}
		t.Fatalf("README.md's sh blocks: %v\n%s\ndaemon log:\n%s", err, log, d.stderr.String())
	}
}

// endProcessGroup ends what is left of a process group: SIGTERM, then
// SIGKILL for what is still there after 10 s.
func endProcessGroup(pgid int) {
	if err := syscall.Kill(-pgid, syscall.SIGTERM); errors.Is(err, syscall.ESRCH) {
		return
	}
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
}

// mdLink is a Markdown link's target: [text](target).
var mdLink = regexp.MustCompile(`\[[^\]]*\]\(([^)\s]+)\)`)

// mdAnchor is the anchor GitHub gives a heading: lower case, punctuation
// dropped, spaces as hyphens.
func mdAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// mdLinksAndAnchors returns the link targets of a Markdown text outside
// code blocks, and the anchors of its headings.
func mdLinksAndAnchors(md string) (links []string, anchors map[string]bool) {
	anchors = map[string]bool{}
	inCode := false
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(strings.TrimLeft(line, " "), "```") {
			inCode = !inCode
			continue
		}
		if inCode {
			continue
		}
		if h := strings.TrimLeft(line, "#"); h != line && strings.HasPrefix(h, " ") {
			anchors[mdAnchor(h)] = true
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			links = append(links, m[1])
		}
	}
	return links, anchors
}

// TestDocLinks: every relative link of the user's documents (README.md,
// docs/, bench/ and deploy/ READMEs) names a file of the repository, and
// a link to a heading of a Markdown file names a heading it has.
func TestDocLinks(t *testing.T) {
	root, err := moduleRoot()
	if err != nil {
		t.Fatal(err)
	}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "bench", "README.md"), filepath.Join(root, "deploy", "README.md"))
	anchorsOf := func(path string) map[string]bool {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		_, a := mdLinksAndAnchors(string(b))
		return a
	}
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		links, _ := mdLinksAndAnchors(string(b))
		rel, _ := filepath.Rel(root, doc)
		for _, link := range links {
			if strings.Contains(link, "://") || strings.HasPrefix(link, "mailto:") {
				continue
			}
			target, frag, _ := strings.Cut(link, "#")
			path := doc
			if target != "" {
				path = filepath.Join(filepath.Dir(doc), target)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: %v", rel, link, err)
					continue
				}
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[frag] {
				t.Errorf("%s: link %q: no heading with the anchor %q", rel, link, frag)
			}
			checked++
		}
	}
	if checked == 0 {
		t.Fatal("no relative link found: the link check checks nothing")
	}
}
