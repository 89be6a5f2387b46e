package approvals

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// repoFixtures are repositories planted in the fake host's workdir, as an
// earlier allowed command (or apply_patch before it was confined) could
// leave them: name → files relative to {work}/<name>. A config that only
// sets ordinary keys is the control.
var repoFixtures = map[string]map[string]string{
	"r-plain": {".git/HEAD": "ref: refs/heads/main\n", ".git/config": "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = false\n" +
		"[remote \"origin\"]\n\turl = https://example.com/x.git\n\tfetch = +refs/heads/*:refs/remotes/origin/*\n[branch \"main\"]\n\tremote = origin\n\tmerge = refs/heads/main\n[user]\n\tname = A ; comment\n"},
	"r-alias":      {".git/config": "[alias]\n\tpw = !touch M\n"},
	"r-fsmonitor":  {".git/config": "[core]\n\tfsmonitor = touch M; false\n"},
	"r-hookspath":  {".git/config": "[core]\n\thooksPath = /tmp/hooks\n"},
	"r-ssh":        {".git/config": "[core]\n\tsshCommand = sh -c 'touch M'\n"},
	"r-pager":      {".git/config": "[core] pager = less\n"},
	"r-external":   {".git/config": "[diff]\n\texternal = /tmp/x\n"},
	"r-textconv":   {".git/config": "[diff \"bin\"]\n\ttextconv = sh -c id\n"},
	"r-filter":     {".git/config": "[filter \"lfs\"]\n\tsmudge = touch M\n"},
	"r-oldsection": {".git/config": "[filter.x]\n\tclean = id\n"},
	"r-credential": {".git/config": "[credential]\n\thelper = !id\n"},
	"r-gpg":        {".git/config": "[gpg]\n\tprogram = id\n"},
	"r-insteadof":  {".git/config": "[url \"ext::sh -c id #\"]\n\tinsteadOf = https://\n"},
	"r-exturl":     {".git/config": "[remote \"origin\"]\n\turl = ext::sh -c id\n"},
	"r-submodule":  {".git/config": "[submodule \"s\"]\n\tupdate = !id\n"},
	"r-continued":  {".git/config": "[core]\n\tpager = \\\n  less\n"},
	"r-quoted":     {".git/config": "[alias]\n\tx = \"!touch M ; echo\"\n"},
	"r-include":    {".git/config": "[include]\n\tpath = ../evil.cfg\n", "evil.cfg": "[alias]\n\tx = !id\n"},
	"r-includeif":  {".git/config": "[includeIf \"gitdir:/\"]\n\tpath = ../../r-include/evil.cfg\n"},
	"r-gitfile":    {".git": "gitdir: ../r-alias/.git\n"},
	"r-worktree":   {".git": "gitdir: ../r-wtmain/.git/worktrees/w\n"},
	"r-wtmain":     {".git/worktrees/w/commondir": "../..\n", ".git/worktrees/w/HEAD": "x\n", ".git/config.worktree": "[core]\n\tfsmonitor = id\n"},
	"bare-alias":   {"HEAD": "ref: refs/heads/main\n", "objects/.keep": "", "refs/.keep": "", "config": "[alias]\n\tx = !id\n"},
	"r-badconfig":  {".git/config": "[core\n"},
}

func plantRepos(t *testing.T, h *host) {
	t.Helper()
	for name, files := range repoFixtures {
		for rel, body := range files {
			p := filepath.Join(h.work, name, rel)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(h.work, "r-alias", "sub", "dir"), 0o755); err != nil {
		t.Fatal(err)
	}
}

// carrierCase is one command of the carrier corpus: with everything in
// {bin} allowlisted (git, find, tar, sed, awk, less, more, man, vim, …),
// want is the reason it is not auto-allowed, "" when it is.
type carrierCase struct {
	cmd  string
	dir  string // workdir below {work}; "" is {work}
	pty  bool
	want string
	why  string
}

func carrierCorpus() []carrierCase {
	cc := ReasonCommandCarrier
	return []carrierCase{
		// git: the requests.
		{cmd: "git config alias.pw '!touch M' get", want: cc, why: "three operands set alias.pw; the value-pattern 'get' is not the get action"},
		{cmd: "git pw", want: cc, why: "pw is no builtin: an alias, which may be !cmd"},
		{cmd: "git clone -u 'touch M;' /src d", want: cc, why: "-u is --upload-pack, run as a command"},
		{cmd: "git clone --upload-pa='touch M;' /src d", want: cc, why: "--upload-pa abbreviates --upload-pack"},
		{cmd: "git grep -O'touch M;:' x", want: cc, why: "-O runs its value as the pager"},
		{cmd: "git status", dir: "r-alias", want: cc, why: "the repository config (planted earlier) has an alias section"},
		// git: options and subcommands.
		{cmd: "git ls-remote --upload-pa=x .", want: cc, why: "abbreviated --upload-pack"},
		{cmd: "git fetch --upload-pack=x origin", want: cc, why: "--upload-pack"},
		{cmd: "git pull --upl=x", want: cc, why: "abbreviated --upload-pack"},
		{cmd: "git push --receive-pack=x origin", want: cc, why: "--receive-pack"},
		{cmd: "git push --rec=x origin", want: cc, why: "abbreviated --receive-pack"},
		{cmd: "git push --exec=x origin", want: cc, why: "--exec is --receive-pack"},
		{cmd: "git send-pack --exec=x r", want: cc, why: "--exec"},
		{cmd: "git archive --remote=r --exec=x HEAD", want: cc, why: "--exec runs the remote's upload-archive"},
		{cmd: "git grep --open-files-in-pager=x x", want: cc, why: "--open-files-in-pager"},
		{cmd: "git grep --open x", want: cc, why: "abbreviated --open-files-in-pager"},
		{cmd: "git grep -nO x", want: cc, why: "-O inside a short-option cluster"},
		{cmd: "git rebase -x 'touch M' main", want: cc, why: "rebase -x runs a command"},
		{cmd: "git rebase --exec='touch M' main", want: cc, why: "rebase --exec"},
		{cmd: "git rebase --ex=x main", want: cc, why: "abbreviated --exec"},
		{cmd: "git rebase -ix x main", want: cc, why: "-x inside a cluster"},
		{cmd: "git log --output=/tmp/x", want: cc, why: "--output writes a file"},
		{cmd: "git diff --outp=/tmp/x", want: cc, why: "abbreviated --output"},
		{cmd: "git show --output /tmp/x", want: cc, why: "--output with its value as the next word"},
		{cmd: "git -c core.pager=x log", want: cc, why: "-c sets any config"},
		{cmd: "git -ccore.pager=x log", want: cc, why: "-c with the value attached"},
		{cmd: "git --config-env=core.pager=X log", want: cc, why: "--config-env"},
		{cmd: "git --exec-path=/tmp status", want: cc, why: "--exec-path= moves git's commands"},
		{cmd: "git --frobnicate status", want: cc, why: "unknown top-level options are refused (git matches them exactly)"},
		{cmd: "git clone --template=/tmp/t src d", want: cc, why: "--template copies hooks"},
		{cmd: "git init --templ=/tmp/t", want: cc, why: "abbreviated --template"},
		{cmd: "git clone -c alias.x=!id src d", want: cc, why: "clone -c writes config into the new repo"},
		{cmd: "git clone --config core.hooksPath=/x src d", want: cc, why: "clone --config"},
		{cmd: "git clone 'ext::sh -c touch% M' d", want: cc, why: "ext:: runs a command"},
		{cmd: "git fetch 'ext::sh -c id'", want: cc, why: "ext:: URL"},
		{cmd: "git remote add x 'ext::sh -c id'", want: cc, why: "plants an ext:: remote"},
		{cmd: "git push evil::x main", want: cc, why: "<helper>:: runs git-remote-evil from PATH"},
		{cmd: "git difftool", want: cc, why: "runs a diff tool"},
		{cmd: "git mergetool", want: cc, why: "runs a merge tool"},
		{cmd: "git filter-branch --tree-filter id HEAD", want: cc, why: "runs shell filters"},
		{cmd: "git bisect run id", want: cc, why: "runs a command"},
		{cmd: "git submodule foreach id", want: cc, why: "runs a command per submodule"},
		{cmd: "git credential fill", want: cc, why: "runs credential helpers"},
		{cmd: "git hook run pre-commit", want: cc, why: "runs hooks"},
		{cmd: "git shell -c id", want: cc, why: "git shell runs commands"},
		{cmd: "git config --add alias.x '!id'", want: cc, why: "config write"},
		{cmd: "git config --ad alias.x y", want: cc, why: "abbreviated --add"},
		{cmd: "git config --unset x.y", want: cc, why: "config write"},
		{cmd: "git config set alias.x '!id'", want: cc, why: "new-style config write"},
		{cmd: "git config edit", want: cc, why: "opens an editor on the config"},
		{cmd: "git config -e", want: cc, why: "--edit"},
		{cmd: "git help -w log", want: cc, why: "runs a browser"},
		{cmd: "git help --web log", want: cc, why: "runs a browser"},
		{cmd: "git config --get user.name", why: "a read"},
		{cmd: "git config --get alias.pw '!touch M'", why: "a read with a value-pattern"},
		{cmd: "git config user.name", why: "one operand reads"},
		{cmd: "git config -l", why: "list"},
		{cmd: "git config --list --show-origin", why: "list with a modifier"},
		{cmd: "git config get user.name", why: "new-style read"},
		{cmd: "git config --get-regexp alias", why: "a read"},
		{cmd: "git status", why: "plain status outside any repository"},
		{cmd: "git log --oneline", dir: "r-plain", why: "an ordinary repository config"},
		{cmd: "git -C r-plain status", why: "-C into an ordinary repository"},
		{cmd: "git log --output-indicator-new=+", why: "--output-indicator-new is not --output"},
		{cmd: "git grep -n std::string", why: "a :: pattern is not a URL for grep"},
		{cmd: "git commit -m 'fix --exec handling'", why: "commit has no runner options"},
		{cmd: "git diff --no-ext-diff", why: "negations are harmless"},
		// git: repository configuration planted by an earlier command.
		{cmd: "git status", dir: "r-fsmonitor", want: cc, why: "core.fsmonitor runs at every status"},
		{cmd: "git commit -m x", dir: "r-hookspath", want: cc, why: "core.hooksPath"},
		{cmd: "git fetch", dir: "r-ssh", want: cc, why: "core.sshCommand"},
		{cmd: "git log", dir: "r-pager", want: cc, why: "core.pager on the header line"},
		{cmd: "git diff", dir: "r-external", want: cc, why: "diff.external"},
		{cmd: "git diff", dir: "r-textconv", want: cc, why: "diff.<driver>.textconv"},
		{cmd: "git checkout .", dir: "r-filter", want: cc, why: "filter.<driver>.smudge"},
		{cmd: "git add .", dir: "r-oldsection", want: cc, why: "[filter.x] old section syntax"},
		{cmd: "git fetch", dir: "r-credential", want: cc, why: "credential.helper !cmd"},
		{cmd: "git log --show-signature", dir: "r-gpg", want: cc, why: "gpg.program"},
		{cmd: "git fetch https://example.com/x", dir: "r-insteadof", want: cc, why: "url.<ext::>.insteadOf rewrites to ext::"},
		{cmd: "git fetch", dir: "r-exturl", want: cc, why: "remote url ext::"},
		{cmd: "git submodule update", dir: "r-submodule", want: cc, why: "submodule update = !cmd"},
		{cmd: "git log", dir: "r-continued", want: cc, why: "a continued value line"},
		{cmd: "git log", dir: "r-quoted", want: cc, why: "a quoted alias with ; inside"},
		{cmd: "git log", dir: "r-include", want: cc, why: "include.path names a file in the work tree"},
		{cmd: "git log", dir: "r-includeif", want: cc, why: "includeIf is followed whatever its condition"},
		{cmd: "git log", dir: "r-gitfile", want: cc, why: "a .git file points to the aliased repository"},
		{cmd: "git log", dir: "r-worktree", want: cc, why: "a linked work tree: the common dir's config.worktree"},
		{cmd: "git log", dir: "r-alias/sub/dir", want: cc, why: "discovery walks up to the repository"},
		{cmd: "git -C bare-alias log", want: cc, why: "a bare repository is discovered too"},
		{cmd: "git --git-dir=r-alias/.git log", want: cc, why: "--git-dir names the repository"},
		{cmd: "git log", dir: "r-badconfig", want: cc, why: "an unparsable config is refused"},
		// find.
		{cmd: "find . -exec id ;", want: cc, why: "-exec"},
		{cmd: "find . -execdir id {} +", want: cc, why: "-execdir"},
		{cmd: "find . -ok id ;", want: cc, why: "-ok"},
		{cmd: "find . -fprint /tmp/x", want: cc, why: "-fprint writes a file"},
		{cmd: "find . -fprintf /tmp/x %p", want: cc, why: "-fprintf writes a file"},
		{cmd: "find . -fprint0 /tmp/x", want: cc, why: "-fprint0"},
		{cmd: "find . -fls /tmp/x", want: cc, why: "-fls writes a file"},
		{cmd: "find . -name '*.o' -delete", want: cc, why: "-delete"},
		{cmd: "find . -name x -print", why: "find's job"},
		// tar.
		{cmd: "tar --to-command='sh -c id' -xf a.tar", want: cc, why: "--to-command"},
		{cmd: "tar --to-c=id -xf a.tar", want: cc, why: "abbreviated --to-command"},
		{cmd: "tar --checkpoint=1 --checkpoint-action=exec=id -cf a.tar .", want: cc, why: "--checkpoint-action=exec="},
		{cmd: "tar -I 'sh -c id' -xf a.tar", want: cc, why: "-I runs a compressor command"},
		{cmd: "tar --use-comp=id -xf a.tar", want: cc, why: "abbreviated --use-compress-program"},
		{cmd: "tar -cIid f.tar x", want: cc, why: "-I inside a cluster"},
		{cmd: "tar xIf id a.tar", want: cc, why: "old-style letters"},
		{cmd: "tar --rsh-command=id -xf host:a.tar", want: cc, why: "--rsh-command"},
		{cmd: "tar -xf host:a.tar", want: cc, why: "a remote archive runs rsh/ssh"},
		{cmd: "tar xf host:a.tar", want: cc, why: "the same, old style"},
		{cmd: "tar -F id -cf a.tar .", want: cc, why: "-F runs a script"},
		{cmd: "tar -M -cf a.tar .", want: cc, why: "the volume prompt has a ! shell escape"},
		{cmd: "tar -xf host:a.tar --force-local", why: "--force-local: a local file with a colon"},
		{cmd: "tar --checkpoint=1000 -cf a.tar .", why: "--checkpoint is exact: not an abbreviation of --checkpoint-action"},
		{cmd: "tar -xzf a.tgz", why: "tar's job"},
		{cmd: "tar cvf a.tar dir", why: "old style, no risk"},
		{cmd: "tar -C /tmp -xf a.tar", why: "-C takes a value"},
		// sed.
		{cmd: "sed 'e id'", want: cc, why: "the e command"},
		{cmd: "sed '1e id' f", want: cc, why: "e with an address"},
		{cmd: "sed 's/x/id/e' f", want: cc, why: "the s///e flag"},
		{cmd: "sed 'w /tmp/x' f", want: cc, why: "w writes a file"},
		{cmd: "sed -n 's/a/b/w /tmp/x' f", want: cc, why: "the s///w flag"},
		{cmd: "sed 's/a/b/;e id' f", want: cc, why: "e after ;"},
		{cmd: "sed '/x/{p;e id\n}' f", want: cc, why: "e inside a block"},
		{cmd: "sed -i s/a/b/ f", want: cc, why: "-i edits files"},
		{cmd: "sed -i.bak s/a/b/ f", want: cc, why: "-i with a suffix"},
		{cmd: "sed --in-pl s/a/b/ f", want: cc, why: "abbreviated --in-place"},
		{cmd: "sed -f script.sed f", want: cc, why: "script from a file"},
		{cmd: "sed -e p -e 'e id' f", want: cc, why: "second -e"},
		{cmd: "sed --exp='e id' f", want: cc, why: "abbreviated --expression"},
		{cmd: "sed 's/[/]/x/' f", want: cc, why: "a delimiter inside a bracket expression"},
		{cmd: "sed --frob p f", want: cc, why: "unknown option (sed's table is complete)"},
		{cmd: "sed s/a/b/ f -i", want: cc, why: "GNU sed permutes: -i after the operands"},
		{cmd: "sed -n '1,5p' f", why: "printing"},
		{cmd: "sed 's/a/b/g' f", why: "substitution"},
		{cmd: "sed -E 's/(a|b)+/x/2' f", why: "extended regex, numeric flag"},
		{cmd: "sed '/foo/d;$!N' f", why: "addresses and negation"},
		{cmd: "sed 'y/abc/xyz/' f", why: "transliteration"},
		{cmd: "sed '1a hello; e id' f", why: "a's text runs to the end of the line: 'hello; e id' is text"},
		{cmd: "sed -n '/a/,/b/{s/x/y/;p}' f", why: "a block"},
		// awk.
		{cmd: `awk 'BEGIN{system("id")}'`, want: cc, why: "system()"},
		{cmd: `awk '{print | "sh"}'`, want: cc, why: "a pipe to a command"},
		{cmd: `awk 'BEGIN{"id" | getline x}'`, want: cc, why: "a pipe from a command"},
		{cmd: `awk '{print > "/tmp/x"}' f`, want: cc, why: "output redirection"},
		{cmd: `awk '{print $1 >> "f"}' f`, want: cc, why: ">>"},
		{cmd: `awk '{printf("%s", $0) > "f"}' f`, want: cc, why: "redirection after printf(...)"},
		{cmd: "awk -f prog.awk f", want: cc, why: "program from a file"},
		{cmd: "awk --fi=prog.awk f", want: cc, why: "abbreviated --file"},
		{cmd: `awk '@load "filefuncs"; BEGIN{}'`, want: cc, why: "@load"},
		{cmd: `awk 'BEGIN{f="system"; @f("id")}'`, want: cc, why: "indirect call"},
		{cmd: "awk --lo=x 'BEGIN{}'", want: cc, why: "abbreviated --load"},
		{cmd: `awk -e 'BEGIN{system("id")}'`, want: cc, why: "gawk -e program text"},
		{cmd: `awk '/[/]/{system("id")}'`, want: cc, why: "a / inside brackets is refused, and system() anyway"},
		{cmd: `awk 'BEGIN{x = 6 / 2 / 1; print "a" | "sh"}'`, want: cc, why: "divisions are not regexes: the pipe is seen"},
		{cmd: "awk -W exec prog", want: cc, why: "mawk -W exec"},
		{cmd: "awk '{print $1}' f", why: "awk's job"},
		{cmd: "awk -F: '$3 > 1000 {print $1}' /etc/passwd", why: "> outside print compares"},
		{cmd: "awk 'NR>1' f", why: "comparison"},
		{cmd: "awk '/a|b/ {print}' f", why: "| inside a regex"},
		{cmd: "awk '{print ($1 > 2)}' f", why: "> in parentheses compares"},
		{cmd: `awk 'BEGIN { x = 4 / 2; print x }'`, why: "division"},
		{cmd: `awk --sandbox 'BEGIN{system("id")}'`, why: "gawk --sandbox disables system()"},
		{cmd: "awk -W version", why: "harmless -W"},
		// pagers and editors.
		{cmd: "less -o /tmp/x f", want: cc, why: "-o writes a log file"},
		{cmd: "less --log=/tmp/x f", want: cc, why: "abbreviated --log-file"},
		{cmd: "less -k keys f", want: cc, why: "lesskey files set environment"},
		{cmd: "less '+!id' f", want: cc, why: "an initial ! command"},
		{cmd: "less -R +G f", why: "a move"},
		{cmd: "less '+/pattern' f", why: "a search"},
		{cmd: "more f", pty: true, want: cc, why: "more has ! in a terminal"},
		{cmd: "more f", why: "without a terminal more copies"},
		{cmd: "man -P 'sh -c id' ls", want: cc, why: "-P runs a pager command"},
		{cmd: "man --pag=id ls", want: cc, why: "abbreviated --pager"},
		{cmd: "man -H ls", want: cc, why: "runs a browser"},
		{cmd: "man ls", why: "MANPAGER=cat at run time"},
		{cmd: "vim f", want: cc, why: "editors run :!cmd"},
		{cmd: "vi -c '!id' f", want: cc, why: "vi -c"},
		{cmd: "ex f", want: cc, why: "ex reads commands from stdin"},
		{cmd: "nano f", want: cc, why: "an editor"},
		{cmd: "xargs id", want: cc, why: "xargs runs commands"},
		{cmd: "env sed 'e id'", want: cc, why: "behind a wrapper"},
		{cmd: "sh -c \"git grep -O'touch M;:' x\"", want: cc, why: "inside sh -c"},
	}
}

func TestCarrierCorpus(t *testing.T) {
	h := newHost(t)
	plantRepos(t, h)
	corpus := carrierCorpus()
	if len(corpus) < 80 {
		t.Fatalf("corpus has %d cases, want at least 80", len(corpus))
	}
	for _, c := range corpus {
		name := c.cmd
		if c.dir != "" {
			name = c.dir + ": " + name
		}
		if c.pty {
			name += " (pty)"
		}
		t.Run(name, func(t *testing.T) {
			opts := h.opts(h.globAllowlist())
			opts.Cwd = filepath.Join(h.work, c.dir)
			opts.PTY = c.pty
			ev := Evaluate(h.sub(c.cmd), opts)
			if c.want == "" {
				if !ev.Satisfied {
					t.Fatalf("not auto-allowed: %s (%s) — want allowed: %s", ev.Reason, ev.Detail, c.why)
				}
				return
			}
			if ev.Satisfied {
				t.Fatalf("auto-allowed as %s — want %s: %s", ev.Rendered, c.want, c.why)
			}
			if ev.Reason != c.want || ev.Detail == "" {
				t.Fatalf("reason %q (%s), want %q: %s", ev.Reason, ev.Detail, c.want, c.why)
			}
		})
	}
}

// TestCarrierDetails pins a few refusal texts: the option is named as the
// tool sees it, with what was written.
func TestCarrierDetails(t *testing.T) {
	cases := map[string]string{
		"git clone --upload-pa=x s d": "git clone --upload-pack (written --upload-pa): runs a command as the remote's upload-pack",
		"tar --to-c=id -xf a":         "tar --to-command (written --to-c): runs a command for each member",
		"git pw":                      "git pw is not a git builtin: an alias (which may run a command) or an external git-pw program",
		"sed -e 'e id'":               "sed e: runs a command",
		"find . -delete":              "find -delete: deletes files",
	}
	for cmd, want := range cases {
		a := Analyze(cmd)
		if a.OK || a.Reason != ReasonCommandCarrier || a.Detail != want {
			t.Errorf("%s: %v %q %q, want %q", cmd, a.OK, a.Reason, a.Detail, want)
		}
	}
}

// TestOptionAbbreviations: long options resolve as getopt_long does, and
// a prefix that could stand for a risky option counts as that option.
func TestOptionAbbreviations(t *testing.T) {
	for _, c := range []struct {
		set  optionSet
		args []string
		bad  bool
	}{
		{sedOptions, []string{"--expr=p"}, false},
		{sedOptions, []string{"--s", "p"}, true}, // silent, separate, sandbox: ambiguous
		{sedOptions, []string{"--in=x"}, true},
		{sedOptions, []string{"-n", "--", "-i"}, false}, // after --, -i is the script
		{tarOptions, []string{"--to=x"}, true},
		{tarOptions, []string{"--checkp=2"}, true}, // checkpoint-action shares the prefix
		{tarOptions, []string{"--exclude=x"}, false},
		{awkOptions, []string{"--so=x"}, false},
		{awkOptions, []string{"--pro"}, true},
		{lessOptions, []string{"--LOG=x"}, true},
		{manOptions, []string{"--htm"}, true},
	} {
		p := c.set.parse(c.args)
		if (p.problem != "") != c.bad {
			t.Errorf("%s %q: problem %q, want bad=%v", c.set.tool, c.args, p.problem, c.bad)
		}
	}
	if got := gitCarrier(strings.Fields("git fetch --upload-p=x")); !strings.Contains(got, "--upload-pack") {
		t.Errorf("git fetch --upload-p: %q", got)
	}
}

// TestSedScriptReader and TestAwkProgramReader pin the readers on the
// shapes they must not misread.
func TestSedScriptReader(t *testing.T) {
	for script, risky := range map[string]bool{
		"p": false, "s/a/b/": false, "s|a|b|g": false, `s/a\/b/c/`: false, "s/[[:alpha:]]/x/": false,
		"$d": false, "1~2d": false, "0,/x/s//y/": false, `\,x,d`: false, "/x/I,+3p": false,
		"b end;p;:end": false, "r /etc/hostname": false, "a\\\ntext": false, "y/a\\/b/c\\/d/": false,
		"e": true, "s/a/b/we": true, "W out": true, "s/a/b/ w x": true, "1!e id": true,
		"s/a/b": true, "s/[/]/x/": true, "s/a/b/q": true, "k": true, "b x y;e id": true, "s,[,],x,": true,
	} {
		if got := sedScriptRisk(script) != ""; got != risky {
			t.Errorf("sed %q: risky=%v (%q)", script, got, sedScriptRisk(script))
		}
	}
}

func TestAwkProgramReader(t *testing.T) {
	for prog, risky := range map[string]bool{
		`{print $1}`: false, `NR > 1 {print}`: false, `{a[$1]++} END {for (k in a) print k, a[k]}`: false,
		`/x|y/`: false, `{print $1 / 2}`: false, `{x = "a|b"; print x}`: false, `# system("id")` + "\n{print}": false,
		`{if ($1 >= 2) print}`: false, `{print a, (b > c)}`: false, `{n++ / 2}`: false, `length / 2 > 1`: false,
		`BEGIN{system("id")}`: true, `{print > "f"}`: true, `{print | "sort"}`: true, `{"date" | getline d}`: true,
		`{print |& "cat"}`: true, `@include "x"`: true, `{print "x" > $2}`: true, `BEGIN{printf "a" >> "b"}`: true,
		`{x = "unterminated}`: true, `/[/]/`: true, `{print $1} # ok` + "\n" + `{print 1 > 2}`: true,
		"{print `id`}": true,
	} {
		if got := awkProgramRisk(prog) != ""; got != risky {
			t.Errorf("awk %q: risky=%v (%q)", prog, got, awkProgramRisk(prog))
		}
	}
}

// TestGitConfigParser pins the configuration syntax the repository check
// reads.
func TestGitConfigParser(t *testing.T) {
	es, err := parseGitConfig([]byte("[Core]\n\tPager = \"less -R\" # c\n[remote \"Up Stream\"] url = x\n[a.B]\nflag\n[x]\n\tv = a\\\n  b ; c\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []gitConfigEntry{{"core", "", "pager", "less -R"}, {"remote", "Up Stream", "url", "x"}, {"a", "b", "flag", "true"}, {"x", "", "v", "a  b"}}
	if len(es) != len(want) {
		t.Fatalf("entries %+v", es)
	}
	for i := range want {
		if es[i] != want[i] {
			t.Errorf("entry %d = %+v, want %+v", i, es[i], want[i])
		}
	}
	for _, bad := range []string{"[core\n", "x = 1\n", "[a]\n1x = 2\n", "[a]\nv = \"open\n", "[a \"b]\n", "[a]\nv = \\q\n"} {
		if _, err := parseGitConfig([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestEveryAbbreviationOfRiskyOptions tests the class rather than the
// strings: every prefix of every risky long option of every tool with
// rules, written --prefix=x, is refused, and so is the risky short form.
func TestEveryAbbreviationOfRiskyOptions(t *testing.T) {
	sets := map[string]optionSet{"tar": tarOptions, "sed": sedOptions, "awk": awkOptions, "less": lessOptions, "man": manOptions}
	n := 0
	for tool, set := range sets {
		for _, o := range set.opts {
			if o.risk == "" {
				continue
			}
			for i := 1; o.long != "" && i <= len(o.long); i++ {
				if slices.ContainsFunc(set.opts, func(h option) bool { return h.risk == "" && h.long == o.long[:i] }) {
					continue // an exact harmless option (tar --checkpoint) is not an abbreviation
				}
				cmd := tool + " --" + o.long[:i] + "=x p"
				if a := Analyze(cmd); a.OK || a.Reason != ReasonCommandCarrier {
					t.Errorf("%s: %v %s", cmd, a.OK, a.Reason)
				}
				n++
			}
			if o.short != 0 {
				cmd := tool + " -" + string(o.short) + "x p"
				if a := Analyze(cmd); a.OK || a.Reason != ReasonCommandCarrier {
					t.Errorf("%s: %v %s", cmd, a.OK, a.Reason)
				}
				n++
			}
		}
	}
	for sub, r := range gitSubRisks {
		for long := range r.long {
			for i := 1; i <= len(long); i++ {
				cmd := "git " + sub + " --" + long[:i] + "=x"
				if a := Analyze(cmd); a.OK || a.Reason != ReasonCommandCarrier {
					t.Errorf("%s: %v %s", cmd, a.OK, a.Reason)
				}
				n++
			}
		}
		for c := range r.short {
			cmd := "git " + sub + " -v" + string(c) + "x"
			if a := Analyze(cmd); a.OK || a.Reason != ReasonCommandCarrier {
				t.Errorf("%s: %v %s", cmd, a.OK, a.Reason)
			}
			n++
		}
	}
	if n < 300 {
		t.Fatalf("only %d forms checked", n)
	}
}

// FuzzCarrierReaders: the sed, awk and git config readers and the option
// parser never panic or loop on any input.
func FuzzCarrierReaders(f *testing.F) {
	for _, s := range []string{"s/a/b/g", "1,/x/{p;e id\n}", `BEGIN{print "x" > "f"}`, "/[/]/", "[core]\n\tpager = \"less\" \\\n x\n",
		"[a \"b\\\"c\"] k = v ; c", "--upload-pa=x", "-cIid"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		sedScriptRisk(s)
		awkProgramRisk(s)
		_, _ = parseGitConfig([]byte(s))
		args := strings.Fields(s)
		for _, set := range []optionSet{tarOptions, sedOptions, awkOptions, lessOptions, manOptions} {
			set.parse(args)
		}
		gitCarrier(append([]string{"git"}, args...))
		gitConfigWrite(args)
		tarOldStyle(args)
	})
}
