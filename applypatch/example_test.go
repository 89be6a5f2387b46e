package applypatch_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"

	"github.com/execmesh/execmesh/applypatch"
)

// A patch edits a function (found through its @@ line), adds a file and
// renames another, all or nothing.
func ExampleApply() {
	root, err := os.MkdirTemp("", "applypatch-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	files := map[string]string{
		"greet.go":  "package main\n\nfunc greet() string {\n\treturn \"hello\"\n}\n",
		"notes.txt": "todo\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o644); err != nil {
			log.Fatal(err)
		}
	}

	patch := `*** Begin Patch
*** Update File: greet.go
@@ func greet() string {
-	return "hello"
+	return "hello, world"
*** Add File: docs/README.md
+# greet
*** Update File: notes.txt
*** Move to: docs/notes.txt
*** End Patch`
	sum, err := applypatch.Apply(context.Background(), root, patch, applypatch.Options{})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(sum.Text())
	greet, err := os.ReadFile(filepath.Join(root, "greet.go"))
	if err != nil {
		log.Fatal(err)
	}
	fmt.Print(string(greet))
	// Output:
	// Success. Updated the following files:
	// A docs/README.md
	// M greet.go
	// M docs/notes.txt (moved from notes.txt)
	// package main
	//
	// func greet() string {
	// 	return "hello, world"
	// }
}

// A hunk whose lines are not in the file is refused with an error that
// names the file, the hunk and the lines, and nothing is written.
func ExampleApply_noMatch() {
	root, err := os.MkdirTemp("", "applypatch-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(root)
	if err := os.WriteFile(filepath.Join(root, "a.txt"), []byte("one\ntwo\n"), 0o644); err != nil {
		log.Fatal(err)
	}

	patch := `*** Begin Patch
*** Add File: b.txt
+new
*** Update File: a.txt
@@
 one
-three
+3
*** End Patch`
	_, err = applypatch.Apply(context.Background(), root, patch, applypatch.Options{})
	fmt.Println(err)
	fmt.Println(errors.Is(err, applypatch.ErrNoMatch))
	_, statErr := os.Stat(filepath.Join(root, "b.txt"))
	fmt.Println(errors.Is(statErr, os.ErrNotExist))
	// Output:
	// a.txt: hunk 1: could not find the expected lines:
	//     one
	//     three
	// true
	// true
}

func ExampleParse() {
	p, err := applypatch.Parse(`*** Begin Patch
*** Delete File: old.txt
*** Update File: main.go
@@ func main() {
-	println("hi")
+	println("hello")
*** End Patch`)
	if err != nil {
		log.Fatal(err)
	}
	for _, f := range p.Files {
		fmt.Println(f.Action, f.Path, len(f.Hunks))
	}
	_, err = applypatch.Parse("*** Begin Patch\n*** Copy File: a\n*** End Patch")
	fmt.Println(err)
	// Output:
	// delete old.txt 0
	// update main.go 1
	// invalid patch: line 2: unknown header "*** Copy File: a": expected "*** Add File:", "*** Delete File:" or "*** Update File:"
}
