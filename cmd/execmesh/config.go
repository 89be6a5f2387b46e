package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/execmesh/execmesh/config"

	"github.com/spf13/cobra"

	"github.com/execmesh/execmesh/gateway"
	"github.com/execmesh/execmesh/internal/atomicfile"
)

// newConfigCmd is `execmesh config get [KEYPATH] | set KEYPATH VALUE |
// unset KEYPATH`. Key paths are the docs' (tools.exec.host,
// agents.list[0].tools.exec.node); [N] indexes a list, and N equal to the
// list's length appends to it.
//
// get prints the value in force (the file over the defaults, under the
// EXECMESH_* variables; strings plain, everything else as JSON) and, on
// stderr, where it comes from when the file does not set it. set parses
// VALUE as JSON when it is valid JSON, except that a key holding a string
// takes the text as is (`config set gateway.auth.token 12345`); otherwise
// VALUE is a plain string. set and unset validate the whole resulting
// document with config.Decode before writing it atomically, so an
// invalid value leaves the file untouched; they do not insist that the
// file they start from is valid, so that they can repair one.
func (c *cli) newConfigCmd() *cobra.Command {
	var f configFlags
	cmd := groupCmd(&cobra.Command{
		Use:   "config SUBCOMMAND",
		Short: "read or edit the JSON config file with the docs' key paths",
		Long: "Read or edit the configuration file (--config, else <state-dir>/config.json) by key path:\n" +
			"tools.exec.host, agents.list[0].tools.exec.node ([N] indexes a list; N = its length appends).\n" +
			"set and unset print what changed (tools.exec.ask: on-miss -> always) and apply it to the daemon\n" +
			"that answers at the gateway URL (POST /v1/admin/reload, with the operator token) when that\n" +
			"daemon reads this file; otherwise they say that it applies at the daemon's SIGHUP\n" +
			"(execmesh reload) or restart.\n\n" +
			"A file that is not valid JSON, or has a bad key or value, stops the commands that need it\n" +
			"with the file, line and column or the key; get, set and unset work all the same (saying\n" +
			"so on stderr), so that they can repair it: set and unset on a file that is not JSON at all\n" +
			"keep it as FILE.invalid-TIME and start a new one.",
		Annotations: map[string]string{annSynopsis: "config get [KEYPATH] | set KEYPATH VALUE | unset KEYPATH"},
	})
	f.register(cmd.PersistentFlags())
	keyPath := func(args []string) ([]pathElem, error) {
		path, err := parseKeyPath(args[0])
		if err != nil {
			return nil, err
		}
		if _, err := schemaType(path); err != nil {
			return nil, err
		}
		return path, nil
	}
	// edit runs a change of the file at the key path args[0].
	edit := func(change func(doc any, path []pathElem, args []string) (any, error)) func(*cobra.Command, []string) error {
		return func(cmd *cobra.Command, args []string) error {
			path, err := keyPath(args)
			if err != nil {
				return err
			}
			file := f.editPath(c)
			ch, err := configEdit(c, file, path, func(doc any) (any, error) { return change(doc, path, args) })
			if err != nil {
				return err
			}
			fmt.Fprintln(c.stdout, ch)
			if !ch.changed() {
				return nil
			}
			return c.applyConfig(cmd.Context(), &f, file, ch.key)
		}
	}
	completeKeys := func(_ *cobra.Command, args []string, prefix string) ([]string, cobra.ShellCompDirective) {
		if len(args) > 0 {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return keyPathCompletions(prefix), cobra.ShellCompDirectiveNoFileComp | cobra.ShellCompDirectiveNoSpace
	}
	get := &cobra.Command{
		Use:   "get [KEYPATH]",
		Short: "print the value in force (the whole configuration without KEYPATH)",
		Long: "Print the value in force: the file over the defaults, under the EXECMESH_* variables (and\n" +
			"--state-dir for stateDir). Strings print plain, everything else as JSON. When the file does\n" +
			"not set the key, a line on stderr says where the value comes from: default, env or flag.",
		Example:           "  execmesh config get tools.exec.security\n  execmesh config get agents.list[0].tools.exec.node\n  execmesh config get",
		Args:              rangeArgs(0, 1, "want at most one KEYPATH"),
		ValidArgsFunction: completeKeys,
		RunE: func(_ *cobra.Command, args []string) error {
			var path []pathElem
			if len(args) == 1 {
				var err error
				if path, err = keyPath(args); err != nil {
					return err
				}
			}
			return configGet(c, &f, path)
		},
	}
	set := &cobra.Command{
		Use:               "set KEYPATH [--] VALUE",
		Short:             "set a key (VALUE as JSON when it parses, else as text); the file is validated first",
		Example:           "  execmesh config set tools.exec.security full\n  execmesh config set tools.exec.pathPrepend '[\"/opt/bin\"]'\n  execmesh config set tools.exec.timeoutSec -- 600",
		Args:              exactArgs(2, "want KEYPATH and VALUE (a negative number after --)"),
		ValidArgsFunction: completeKeys,
		RunE: edit(func(doc any, path []pathElem, args []string) (any, error) {
			t, _ := schemaType(path)
			return setIn(doc, path, parseValue(args[1], t), "")
		}),
	}
	unset := &cobra.Command{
		Use:               "unset KEYPATH",
		Short:             "remove a key (its default applies again)",
		Example:           "  execmesh config unset tools.exec.ask",
		Args:              exactArgs(1, "want one KEYPATH"),
		ValidArgsFunction: completeKeys,
		RunE: edit(func(doc any, path []pathElem, _ []string) (any, error) {
			return unsetIn(doc, path, ""), nil
		}),
	}
	cmd.AddCommand(get, set, unset)
	return cmd
}

// pathElem is one step of a key path: an object key or a list index.
type pathElem struct {
	key     string
	index   int
	isIndex bool
}

func (e pathElem) String() string {
	if e.isIndex {
		return "[" + strconv.Itoa(e.index) + "]"
	}
	return e.key
}

// keyPathString renders path back as "a.b[0].c".
func keyPathString(path []pathElem) string {
	var b strings.Builder
	for i, e := range path {
		if i > 0 && !e.isIndex {
			b.WriteByte('.')
		}
		b.WriteString(e.String())
	}
	return b.String()
}

// parseKeyPath parses "a.b[0].c" into its steps.
func parseKeyPath(s string) ([]pathElem, error) {
	bad := func(why string) error { return usageErrorf("invalid key path %q: %s", s, why) }
	var path []pathElem
	for seg := range strings.SplitSeq(s, ".") {
		name, idx, _ := strings.Cut(seg, "[")
		if name == "" {
			return nil, bad("empty key")
		}
		if strings.ContainsAny(name, "]") {
			return nil, bad("stray ]")
		}
		path = append(path, pathElem{key: name})
		if idx == "" && !strings.Contains(seg, "[") {
			continue
		}
		// idx is "N]" or "N][M]…".
		for rest := "[" + idx; rest != ""; {
			num, after, ok := strings.Cut(strings.TrimPrefix(rest, "["), "]")
			if !strings.HasPrefix(rest, "[") || !ok {
				return nil, bad("want [N] after " + name)
			}
			n, err := strconv.Atoi(num)
			if err != nil || n < 0 || num != strconv.Itoa(n) {
				return nil, bad(fmt.Sprintf("index %q is not a non-negative integer", num))
			}
			path = append(path, pathElem{index: n, isIndex: true})
			rest = after
		}
	}
	return path, nil
}

// jsonName is the JSON key of a struct field ("" for skipped fields).
func jsonName(f reflect.StructField) string {
	tag := f.Tag.Get("json")
	if tag == "-" || !f.IsExported() {
		return ""
	}
	if name, _, _ := strings.Cut(tag, ","); name != "" {
		return name
	}
	return f.Name
}

// fieldByJSON finds the struct field with JSON key name.
func fieldByJSON(t reflect.Type, name string) (reflect.StructField, bool) {
	for i := range t.NumField() {
		if f := t.Field(i); jsonName(f) == name {
			return f, true
		}
	}
	return reflect.StructField{}, false
}

// schemaType checks path against config.Config and returns the Go type
// the path leads to. Unknown keys are an error that names the path.
func schemaType(path []pathElem) (reflect.Type, error) {
	t := reflect.TypeFor[config.Config]()
	for i, e := range path {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		at := keyPathString(path[:i+1])
		switch {
		case e.isIndex:
			if t.Kind() != reflect.Slice {
				return nil, fmt.Errorf("unknown key path %s: %s is not a list", at, keyPathString(path[:i]))
			}
			t = t.Elem()
		case t.Kind() == reflect.Struct:
			f, ok := fieldByJSON(t, e.key)
			if !ok {
				return nil, fmt.Errorf("unknown key path %s", at)
			}
			t = f.Type
		case t.Kind() == reflect.Map:
			t = t.Elem()
		default:
			return nil, fmt.Errorf("unknown key path %s: %s is not an object", at, keyPathString(path[:i]))
		}
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t, nil
}

// configGet prints the value in force at path (the whole configuration
// for an empty path) and, on stderr, its origin when the file does not set
// it.
func configGet(c *cli, f *configFlags, path []pathElem) error {
	file := f.filePath(c)
	var doc any
	if file != "" {
		data, err := os.ReadFile(file)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			file = "" // --config names a file `config set` has not created yet
		case err != nil:
			return fmt.Errorf("config: %w", err)
		case len(bytes.TrimSpace(data)) > 0:
			_ = json.Unmarshal(data, &doc) // LoadConfig reports a bad document
		}
	}
	cfg, err := config.Load(file, c.env)
	if err != nil && file != "" {
		// get needs no valid file: it shows what applies without it,
		// and says so, so that the file can be repaired with set.
		if ferr := config.CheckFile(file); ferr != nil {
			fmt.Fprintf(c.stderr, "execmesh: ignoring the configuration file (the values below are the defaults and EXECMESH_* variables): %v\n", ferr)
			file, doc = "", nil
			cfg, err = config.Load("", c.env)
		}
	}
	if err != nil {
		return err
	}
	key := keyPathString(path)
	origin := ""
	inFile := file != "" && docHas(doc, path)
	switch {
	case key == "stateDir" && f.stateDir != "":
		cfg.StateDir, origin = f.stateDir, "from --state-dir"
	case key == "stateDir" && !inFile:
		cfg.StateDir = f.resolveStateDir(c)
	}
	if v := config.EnvVar(key); v != "" && origin == "" {
		if _, set := c.env[v]; set {
			origin = "from $" + v
		}
	}
	if origin == "" && !inFile && len(path) > 0 {
		where := "no configuration file"
		if file != "" {
			where = "not set in " + file
		}
		origin = "default (" + where + ")"
	}
	// Keys whose unset value means "computed": show what applies.
	if len(path) == 3 && path[0].key == "tools" && path[1].key == "exec" && !inFile {
		sec, ask := cfg.ExecPolicy(gateway.DefaultAgentID)
		switch path[2].key {
		case "security":
			if cfg.Tools.Exec.Security == "" {
				cfg.Tools.Exec.Security = sec
				if sec == "allowlist" {
					origin += "; deny when the configured host is the sandbox"
				}
			}
		case "ask":
			if cfg.Tools.Exec.Ask == "" {
				cfg.Tools.Exec.Ask = ask
			}
		}
	}
	v := reflect.ValueOf(cfg)
	for i, e := range path {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				fmt.Fprintln(c.stdout, "null")
				return nil
			}
			v = v.Elem()
		}
		at := keyPathString(path[:i+1])
		switch {
		case e.isIndex:
			if e.index >= v.Len() {
				return fmt.Errorf("%s: not set (the list has %d entries)", at, v.Len())
			}
			v = v.Index(e.index)
		case v.Kind() == reflect.Struct:
			f, _ := fieldByJSON(v.Type(), e.key)
			v = v.FieldByIndex(f.Index)
		case v.Kind() == reflect.Map:
			mv := v.MapIndex(reflect.ValueOf(e.key))
			if !mv.IsValid() {
				return fmt.Errorf("%s: not set", at)
			}
			v = mv
		}
	}
	if err := printValue(c, v); err != nil {
		return err
	}
	if origin != "" {
		fmt.Fprintf(c.stderr, "(%s: %s)\n", key, origin)
	}
	return nil
}

// docHas reports whether the JSON document (as decoded into any) holds a
// value at path.
func docHas(doc any, path []pathElem) bool {
	for _, e := range path {
		switch n := doc.(type) {
		case map[string]any:
			v, ok := n[e.key]
			if e.isIndex || !ok {
				return false
			}
			doc = v
		case []any:
			if !e.isIndex || e.index >= len(n) {
				return false
			}
			doc = n[e.index]
		default:
			return false
		}
	}
	return true
}

// keyPathCompletions lists the key paths that extend prefix by one step
// (objects end with "." so that completion continues).
func keyPathCompletions(prefix string) []string {
	parent, _ := "", prefix
	if i := strings.LastIndex(prefix, "."); i >= 0 {
		parent = prefix[:i]
	}
	t := reflect.TypeFor[config.Config]()
	if parent != "" {
		path, err := parseKeyPath(parent)
		if err != nil {
			return nil
		}
		if t, err = schemaType(path); err != nil {
			return nil
		}
	}
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Slice {
		t = t.Elem()
	}
	if t.Kind() != reflect.Struct {
		return nil
	}
	var out []string
	for i := range t.NumField() {
		name := jsonName(t.Field(i))
		if name == "" {
			continue
		}
		full := name
		if parent != "" {
			full = parent + "." + name
		}
		ft := t.Field(i).Type
		for ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		switch ft.Kind() {
		case reflect.Struct:
			full += "."
		case reflect.Slice:
			if e := ft.Elem(); e.Kind() == reflect.Struct {
				full += "[0]."
			}
		}
		if strings.HasPrefix(full, prefix) {
			out = append(out, full)
		}
	}
	return out
}

// printValue prints a configuration value: a string plain, an unset list
// as [] and an unset object as {}, anything else as indented JSON.
func printValue(c *cli, v reflect.Value) error {
	switch {
	case v.Kind() == reflect.String:
		fmt.Fprintln(c.stdout, v.String())
		return nil
	case v.Kind() == reflect.Slice && v.IsNil():
		fmt.Fprintln(c.stdout, "[]")
		return nil
	case v.Kind() == reflect.Map && v.IsNil():
		fmt.Fprintln(c.stdout, "{}")
		return nil
	}
	out, err := json.MarshalIndent(v.Interface(), "", "  ")
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	fmt.Fprintf(c.stdout, "%s\n", out)
	return nil
}

// parseValue turns VALUE into the JSON value to store: valid JSON is taken
// as JSON, except that a string key keeps the text itself when the JSON is
// not a string (a numeric token stays a string); anything else is a plain
// string.
func parseValue(s string, target reflect.Type) any {
	if !json.Valid([]byte(s)) {
		return s
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber() // keep numbers exactly as written
	var v any
	if err := dec.Decode(&v); err != nil {
		return s
	}
	if _, isString := v.(string); target.Kind() == reflect.String && !isString && v != nil {
		return s
	}
	return v
}

// setIn returns node with val stored at path, creating objects and lists
// on the way. A list index may be the list's length, which appends.
func setIn(node any, path []pathElem, val any, at string) (any, error) {
	if len(path) == 0 {
		return val, nil
	}
	e := path[0]
	here := joinPath(at, e)
	if e.isIndex {
		var list []any
		switch n := node.(type) {
		case nil:
		case []any:
			list = n
		default:
			return nil, fmt.Errorf("%s: %s is not a list in the file", here, at)
		}
		switch {
		case e.index > len(list):
			return nil, fmt.Errorf("%s: index out of range (the list has %d entries; [%d] appends)", here, len(list), len(list))
		case e.index == len(list):
			list = append(list, nil)
		}
		child, err := setIn(list[e.index], path[1:], val, here)
		if err != nil {
			return nil, err
		}
		list[e.index] = child
		return list, nil
	}
	var obj map[string]any
	switch n := node.(type) {
	case nil:
		obj = map[string]any{}
	case map[string]any:
		obj = n
	default:
		return nil, fmt.Errorf("%s: %s is not an object in the file", here, orDash(at, "the document"))
	}
	child, err := setIn(obj[e.key], path[1:], val, here)
	if err != nil {
		return nil, err
	}
	obj[e.key] = child
	return obj, nil
}

// unsetIn returns node without the value at path: an object key is
// deleted, a list element removed (later ones move up). Objects left empty
// on the way are removed too. A path that is not there changes nothing.
func unsetIn(node any, path []pathElem, at string) any {
	if len(path) == 0 {
		return node
	}
	e := path[0]
	here := joinPath(at, e)
	switch n := node.(type) {
	case []any:
		if !e.isIndex || e.index >= len(n) {
			return node
		}
		if len(path) == 1 {
			return append(n[:e.index:e.index], n[e.index+1:]...)
		}
		n[e.index] = unsetIn(n[e.index], path[1:], here)
		return n
	case map[string]any:
		child, ok := n[e.key]
		if e.isIndex || !ok {
			return node
		}
		if len(path) == 1 {
			delete(n, e.key)
			return n
		}
		child = unsetIn(child, path[1:], here)
		if m, isObj := child.(map[string]any); isObj && len(m) == 0 {
			delete(n, e.key)
		} else {
			n[e.key] = child
		}
		return n
	default:
		return node
	}
}

func joinPath(at string, e pathElem) string {
	if at == "" || e.isIndex {
		return at + e.String()
	}
	return at + "." + e.String()
}

// configChange is what `config set` or `unset` did to one key: its value
// in force (the file over the defaults) before and after.
type configChange struct {
	key           string
	before, after string
	// unset: the key was removed, so its default applies.
	unset bool
}

func (ch configChange) changed() bool { return ch.before != ch.after }

// String is the line set and unset print: "tools.exec.ask: on-miss ->
// always".
func (ch configChange) String() string {
	if !ch.changed() {
		return fmt.Sprintf("%s: %s (unchanged)", ch.key, ch.before)
	}
	s := fmt.Sprintf("%s: %s -> %s", ch.key, ch.before, ch.after)
	if ch.unset {
		s += " (default)"
	}
	return s
}

// configEdit reads the JSON document in file (an empty object when the
// file is missing), applies edit, validates the result with
// config.Decode and writes it atomically. Nothing is written when
// any step fails. A file that is not JSON at all cannot be edited: it is
// kept beside as FILE.invalid-TIME, said on stderr, and the edit starts
// from an empty document, so that set can repair what nothing else can
// read.
func configEdit(c *cli, file string, path []pathElem, edit func(doc any) (any, error)) (configChange, error) {
	key := keyPathString(path)
	ch := configChange{key: key}
	data, err := os.ReadFile(file)
	missing := errors.Is(err, fs.ErrNotExist)
	if err != nil && !missing {
		return ch, fmt.Errorf("config: %w", err)
	}
	doc := any(map[string]any{})
	invalid := ""
	if len(bytes.TrimSpace(data)) > 0 {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.UseNumber()
		var derr error
		if err := dec.Decode(&doc); err != nil {
			derr = config.CheckFile(file) // the error with line and column
			if derr == nil {
				derr = err
			}
		} else if _, ok := doc.(map[string]any); !ok {
			derr = fmt.Errorf("config %s: the document is not a JSON object", file)
		}
		if derr != nil {
			invalid = fmt.Sprintf("%s.invalid-%s", file, time.Now().UTC().Format("20060102T150405Z"))
			fmt.Fprintf(c.stderr, "execmesh: ignoring the configuration file: %v; it is kept as %s and %s starts anew with this change\n", derr, invalid, file)
			doc, data = map[string]any{}, nil
		}
	}
	ch.before = valueInForce(data, path)
	doc, err = edit(doc)
	if err != nil {
		return ch, fmt.Errorf("config %s: %w", key, err)
	}
	out, err := json.MarshalIndent(doc, "", "  ")
	if err != nil {
		return ch, fmt.Errorf("config %s: %w", key, err)
	}
	out = append(out, '\n')
	if _, err := config.Decode(out); err != nil {
		return ch, fmt.Errorf("config %s: %w (%s left unchanged)", key, err, file)
	}
	ch.after = valueInForce(out, path)
	ch.unset = !docHasJSON(out, path)
	if missing && bytes.Equal(out, []byte("{}\n")) {
		return ch, nil // unset on a missing file: nothing to write
	}
	if invalid != "" {
		if err := os.Rename(file, invalid); err != nil {
			return ch, fmt.Errorf("config: keeping the invalid file: %w", err)
		}
	}
	return ch, writeFileAtomic(file, out)
}

// valueInForce renders the value at path that the document gives over
// the defaults, as get prints it (strings plain, the rest as compact
// JSON; security and ask as computed when unset). A document that does
// not decode gives what decodes of it, over the defaults.
func valueInForce(data []byte, path []pathElem) string {
	cfg := config.Default()
	if len(bytes.TrimSpace(data)) > 0 {
		_ = json.Unmarshal(data, &cfg)
	}
	if len(path) == 3 && path[0].key == "tools" && path[1].key == "exec" {
		sec, ask := cfg.ExecPolicy(gateway.DefaultAgentID)
		switch {
		case path[2].key == "security" && cfg.Tools.Exec.Security == "":
			cfg.Tools.Exec.Security = sec
		case path[2].key == "ask" && cfg.Tools.Exec.Ask == "":
			cfg.Tools.Exec.Ask = ask
		}
	}
	v := reflect.ValueOf(cfg)
	for _, e := range path {
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return "null"
			}
			v = v.Elem()
		}
		switch {
		case e.isIndex:
			if v.Kind() != reflect.Slice || e.index >= v.Len() {
				return "(not set)"
			}
			v = v.Index(e.index)
		case v.Kind() == reflect.Struct:
			f, ok := fieldByJSON(v.Type(), e.key)
			if !ok {
				return "(not set)"
			}
			v = v.FieldByIndex(f.Index)
		case v.Kind() == reflect.Map:
			if v = v.MapIndex(reflect.ValueOf(e.key)); !v.IsValid() {
				return "(not set)"
			}
		default:
			return "(not set)"
		}
	}
	if v.Kind() == reflect.String {
		if v.String() == "" {
			return `""`
		}
		return v.String()
	}
	b, err := json.Marshal(v.Interface())
	if err != nil {
		return "?"
	}
	return string(b)
}

// docHasJSON reports whether the JSON document data holds a value at path.
func docHasJSON(data []byte, path []pathElem) bool {
	var doc any
	if json.Unmarshal(data, &doc) != nil {
		return false
	}
	return docHas(doc, path)
}

// writeFileAtomic replaces file with data (0600: it may hold the gateway
// token), so readers see the old or the new document, never a part.
func writeFileAtomic(file string, data []byte) error {
	if err := atomicfile.Write(file, data, 0o600); err != nil {
		return fmt.Errorf("config: %w", err)
	}
	return nil
}
