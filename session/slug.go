package session

import (
	"crypto/rand"
	"encoding/binary"
	"strconv"
	"time"
)

// Session ids are readable slugs such as "nimble-coral", drawn with a
// secure RNG from OpenClaw's word lists (src/agents/session-slug.ts) so that
// ids look the same whichever implementation made them.

var slugAdjectives = [...]string{
	"amber", "briny", "brisk", "calm", "clear", "cool", "crisp", "dawn", "delta", "ember",
	"faint", "fast", "fresh", "gentle", "glow", "good", "grand", "keen", "kind", "lucky",
	"marine", "mellow", "mild", "neat", "nimble", "nova", "oceanic", "plaid", "quick", "quiet",
	"rapid", "salty", "sharp", "swift", "tender", "tidal", "tidy", "tide", "vivid", "warm",
	"wild", "young",
}

var slugNouns = [...]string{
	"atlas", "basil", "bison", "bloom", "breeze", "canyon", "cedar", "claw", "cloud", "comet",
	"coral", "cove", "crest", "crustacean", "daisy", "dune", "ember", "falcon", "fjord", "forest",
	"glade", "gulf", "harbor", "haven", "kelp", "lagoon", "lobster", "meadow", "mist", "nudibranch",
	"nexus", "ocean", "orbit", "otter", "pine", "prairie", "reef", "ridge", "river", "rook",
	"sable", "sage", "seaslug", "shell", "shoal", "shore", "slug", "summit", "tidepool", "trail",
	"valley", "wharf", "willow", "zephyr",
}

const slugFallbackAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// secureIntn returns a uniform integer in [0, n) from crypto/rand.
func secureIntn(n int) int {
	// Rejection sampling keeps the distribution uniform.
	limit := ^uint32(0) - ^uint32(0)%uint32(n)
	var b [4]byte
	for {
		_, _ = rand.Read(b[:]) // never fails since Go 1.24
		if v := binary.LittleEndian.Uint32(b[:]); v < limit {
			return int(v % uint32(n))
		}
	}
}

func slugBase(words int) string {
	s := slugAdjectives[secureIntn(len(slugAdjectives))] + "-" + slugNouns[secureIntn(len(slugNouns))]
	if words > 2 {
		s += "-" + slugNouns[secureIntn(len(slugNouns))]
	}
	return s
}

// NewSessionID returns an id for which taken is false: up to 12 random
// bases, each tried bare and with the suffixes -2 … -12; then the same with
// three-word bases; finally a three-word base with a random suffix (and
// the time in base 36 if even that is taken). taken may reserve the id
// it is asked about: the gateway's index creates each candidate in a KV
// bucket and reports taken when the key exists, so the first id it reports
// free is already its own. The last fallback (a random suffix, then the
// time) is returned without a second question when taken refused it.
func NewSessionID(taken func(string) bool) string {
	for _, words := range []int{2, 3} {
		for attempt := 0; attempt < 12; attempt++ {
			base := slugBase(words)
			if !taken(base) {
				return base
			}
			for i := 2; i <= 12; i++ {
				if c := base + "-" + strconv.Itoa(i); !taken(c) {
					return c
				}
			}
		}
	}
	suffix := make([]byte, 3)
	for i := range suffix {
		suffix[i] = slugFallbackAlphabet[secureIntn(len(slugFallbackAlphabet))]
	}
	id := slugBase(3) + "-" + string(suffix)
	if taken(id) {
		id += "-" + strconv.FormatInt(time.Now().UnixMilli(), 36)
	}
	return id
}

// MaxSessionIDLen is the longest session id: it names the session's
// cgroup and state-dir record, and is a KV key of the session index.
const MaxSessionIDLen = 64

// ValidSessionID reports whether id can be a session id: 1 to
// MaxSessionIDLen lower-case letters, digits and '-', as slugs are (a
// plain file name, a single subject token).
func ValidSessionID(id string) bool {
	if id == "" || len(id) > MaxSessionIDLen || id[0] == '-' {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
