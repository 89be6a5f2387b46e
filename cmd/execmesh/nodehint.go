package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/execmesh/execmesh/protocol"
)

// unknownNodeHint returns the suggestion for an exec call that named a
// node the gateway does not know (err is its refusal, which lists the
// paired nodes): the known name or id nearest to node by edit distance,
// as `did you mean --node X?`, or "" when err is another error or no
// known name is near enough to be the likely typo.
func unknownNodeHint(ctx context.Context, cl *client, node string, err error) string {
	var pe *protocol.Error
	if node == "" || !errors.As(err, &pe) || !strings.Contains(pe.Message, fmt.Sprintf("node %q is unknown", node)) {
		return ""
	}
	var ans struct {
		Nodes []nodeInfo `json:"nodes"`
	}
	if _, lerr := cl.getJSON(ctx, "/v1/nodes", nil, &ans); lerr != nil {
		return "" // the refusal alone still names the known nodes
	}
	var known []string
	for _, n := range ans.Nodes {
		if !n.Paired {
			continue
		}
		if n.Name != "" {
			known = append(known, n.Name)
		}
		known = append(known, n.ID)
	}
	if best := nearestName(node, known); best != "" {
		return "did you mean --node " + best + "?"
	}
	return ""
}

// nearestName returns the candidate with the smallest edit distance to
// name (case-insensitive; the first of equals), provided the distance is
// small enough for a typo: at most 2, or a third of the candidate's
// length for longer names. "" when none qualifies.
func nearestName(name string, candidates []string) string {
	best, bestDist := "", -1
	for _, c := range candidates {
		d := editDistance(strings.ToLower(name), strings.ToLower(c))
		if d > max(2, len([]rune(c))/3) {
			continue
		}
		if bestDist < 0 || d < bestDist {
			best, bestDist = c, d
		}
	}
	return best
}

// editDistance is the Levenshtein distance of a and b in runes: the
// fewest insertions, deletions and substitutions that turn a into b.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(rb)]
}
