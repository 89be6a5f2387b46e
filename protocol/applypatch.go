package protocol

import "strings"

// ToolApplyPatch is the apply_patch tool: structured multi-file edits.
const ToolApplyPatch = "apply_patch"

// ApplyPatchArgs are the parameters of the apply_patch tool. Relative paths
// in the patch are relative to Workdir.
type ApplyPatchArgs struct {
	Input   string `json:"input"`
	Workdir string `json:"workdir,omitempty"`
	Host    string `json:"host,omitempty"`
	Node    string `json:"node,omitempty"`
}

var applyPatchParams = map[string]paramKind{
	"input": kString, "workdir": kString, "host": kString, "node": kString,
}

// DecodeApplyPatchArgs decodes apply_patch arguments strictly.
func DecodeApplyPatchArgs(raw []byte) (ApplyPatchArgs, error) {
	var a ApplyPatchArgs
	fields, err := splitObject(ToolApplyPatch, raw)
	if err != nil {
		return a, err
	}
	for _, name := range sortedKeys(fields) {
		v := fields[name]
		k, ok := applyPatchParams[name]
		if !ok {
			if name == "patch" {
				return ApplyPatchArgs{}, Errorf(ErrInvalidRequest, "%s parameter %q is unsupported; use %q instead", ToolApplyPatch, name, "input")
			}
			return ApplyPatchArgs{}, unknownParam(ToolApplyPatch, name, applyPatchParams)
		}
		if isNull(v) {
			continue
		}
		var dst *string
		switch name {
		case "input":
			dst = &a.Input
		case "workdir":
			dst = &a.Workdir
		case "host":
			dst = &a.Host
		case "node":
			dst = &a.Node
		}
		if err := decodeValue(ToolApplyPatch, name, k, v, dst); err != nil {
			return ApplyPatchArgs{}, err
		}
	}
	if strings.TrimSpace(a.Input) == "" {
		return ApplyPatchArgs{}, Errorf(ErrInvalidRequest, "Provide a patch in \"input\" (*** Begin Patch … *** End Patch).")
	}
	return a, nil
}
