package protocol

import (
	"maps"
	"testing"
)

func TestNodePathOverrideAllowed(t *testing.T) {
	const own = "/usr/local/bin:/usr/bin:/bin"
	cases := []struct {
		requested, own string
		want           bool
	}{
		{own, own, true},
		{"/opt/tools/bin:" + own, own, true},
		{"/opt/a:/opt/b:" + own, own, true},
		{"/home/u/.cargo/bin:" + own, own, true},
		{"", "", true},

		{"/usr/bin:/bin", own, false},                  // drops /usr/local/bin
		{"/opt/evil", own, false},                      // replaces
		{own + ":/opt/tools/bin", own, false},          // appends: own is not at the end
		{":" + own, own, false},                        // empty entry = working directory
		{"/opt/a::" + own, own, false},                 // empty entry in the middle
		{".:" + own, own, false},                       // relative entry
		{"bin:" + own, own, false},                     // relative entry
		{"/opt/a:./x:" + own, own, false},              // relative entry in the middle
		{"x" + own, own, false},                        // not a separate entry
		{"/opt/a" + own, own, false},                   // glued to the first entry
		{"/opt/a:/usr/local/bin:/usr/bin", own, false}, // own truncated
		{"", own, false},
		{"/opt/a", "", false}, // node without PATH: nothing to prepend to
		{"/opt/a:", "", false},
		{own + "\n", own, false},
		{"/opt/a:" + own, "/usr/bin", false},
	}
	for _, c := range cases {
		if got := NodePathOverrideAllowed(c.requested, c.own); got != c.want {
			t.Errorf("NodePathOverrideAllowed(%q, %q) = %v, want %v", c.requested, c.own, got, c.want)
		}
	}
}

func TestMergePathPrepend(t *testing.T) {
	cases := []struct {
		name    string
		prepend []string
		path    string
		want    string
	}{
		// Spec §23.5 case 51.
		{"spec 51", []string{"/custom/bin", "/opt/oss/bin"}, "/usr/bin", "/custom/bin:/opt/oss/bin:/usr/bin"},
		{"normalises prepend", []string{" /a ", "", "  ", "/b", "/a"}, "/usr/bin", "/a:/b:/usr/bin"},
		{"dedupes against path, first wins", []string{"/usr/bin", "/opt/bin"}, "/bin:/usr/bin:/opt/bin", "/usr/bin:/opt/bin:/bin"},
		{"normalises path entries", []string{"/a"}, " /b :: /c:/b:", "/a:/b:/c"},
		{"empty path", []string{"/a", "/b"}, "", "/a:/b"},
		{"nil prepend leaves path alone", nil, " /b ::/b", " /b ::/b"},
		{"blank prepend leaves path alone", []string{" ", ""}, "/b::/b", "/b::/b"},
		{"nothing at all", nil, "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if got := MergePathPrepend(c.prepend, c.path); got != c.want {
				t.Errorf("MergePathPrepend(%q, %q) = %q, want %q", c.prepend, c.path, got, c.want)
			}
		})
	}
}

func TestApplyPathPrepend(t *testing.T) {
	cases := []struct {
		name    string
		env     map[string]string
		prepend []string
		want    map[string]string
	}{
		{"PATH", map[string]string{"PATH": "/usr/bin", "HOME": "/h"}, []string{"/x"},
			map[string]string{"PATH": "/x:/usr/bin", "HOME": "/h"}},
		{"Windows-style key", map[string]string{"Path": "/usr/bin"}, []string{"/x"},
			map[string]string{"Path": "/x:/usr/bin"}},
		{"PATH preferred over Path", map[string]string{"Path": "/p", "PATH": "/P"}, []string{"/x"},
			map[string]string{"Path": "/p", "PATH": "/x:/P"}},
		{"first of several case variants", map[string]string{"path": "/l", "Path": "/p"}, []string{"/x"},
			map[string]string{"path": "/l", "Path": "/x:/p"}},
		{"no PATH yet", map[string]string{"HOME": "/h"}, []string{"/x", "/y"},
			map[string]string{"HOME": "/h", "PATH": "/x:/y"}},
		{"nothing to do", map[string]string{"HOME": "/h"}, nil,
			map[string]string{"HOME": "/h"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			env := maps.Clone(c.env)
			ApplyPathPrepend(env, c.prepend)
			if !maps.Equal(env, c.want) {
				t.Errorf("env = %q, want %q", env, c.want)
			}
		})
	}
}

func TestPathPrependWarning(t *testing.T) {
	const want = "Warning: tools.exec.pathPrepend is ignored for host=node. Configure PATH on the node host/service instead."
	if PathPrependIgnoredOnNodeWarning != want {
		t.Errorf("warning = %q, want %q", PathPrependIgnoredOnNodeWarning, want)
	}
}
