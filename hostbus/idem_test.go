package hostbus

import (
	"fmt"
	"testing"
	"time"
)

func TestIdemCacheBounds(t *testing.T) {
	c := newIdemCache(time.Minute, 2)
	now := time.Unix(1000, 0)
	c.now = func() time.Time { return now }
	for i := range 5 {
		if _, err, replayed := c.do(t.Context(), fmt.Sprint("k", i), "s", func() ([]byte, error) { return []byte("x"), nil }); err != nil || replayed {
			t.Fatal(err, replayed)
		}
	}
	if c.len() != 2 {
		t.Fatalf("kept %d, want 2", c.len())
	}
	now = now.Add(2 * time.Minute)
	c.do(t.Context(), "fresh", "s", func() ([]byte, error) { return nil, nil })
	if c.len() != 1 {
		t.Fatalf("kept %d after expiry, want 1", c.len())
	}
	if _, _, replayed := c.do(t.Context(), "fresh", "s", func() ([]byte, error) { t.Fatal("ran twice"); return nil, nil }); !replayed {
		t.Fatal("not replayed")
	}
	if _, err, _ := c.do(t.Context(), "fresh", "other-scope", func() ([]byte, error) { return nil, nil }); err == nil {
		t.Fatal("a key reused by another sessionKey was answered")
	}
	// The byte budget drops the oldest replies.
	c = newIdemCache(time.Hour, 100)
	c.maxBytes = 10
	for i := range 4 {
		c.do(t.Context(), fmt.Sprint("b", i), "s", func() ([]byte, error) { return []byte("12345"), nil })
	}
	if c.len() != 2 || c.bytes != 10 {
		t.Fatalf("kept %d entries, %d bytes; want 2, 10", c.len(), c.bytes)
	}
}
