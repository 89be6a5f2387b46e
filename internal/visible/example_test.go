package visible_test

import (
	"fmt"

	"github.com/execmesh/execmesh/internal/visible"
)

func ExampleString() {
	fmt.Println(visible.String("rm -rf ~/\x1b[2K\rls -la \u202etxt"))
	// Output: rm -rf ~/\x1b[2K\rls -la \u202etxt
}
