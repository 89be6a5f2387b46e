package protocol

import "strings"

// execmesh's additions to OpenClaw's request-env blocklist. OpenClaw's lists
// (env_policy.go) stay exactly as OpenClaw ships
// them, pinned by testdata/conformance/host_env.json, and so do its
// predicates (IsDangerousHostEnvVarName and the others); these tables are
// applied on top, to request overrides only (InspectEnvOverrides,
// ValidateHostEnvOverrides, SanitizeHostEnv's overrides), never to the
// daemon's own, inherited environment. They cover variables that make an
// allowlisted tool run a program, load code or write a file:
//
//   - pagers, editors and askpass helpers under any name (suffixes PAGER,
//     EDITOR, ASKPASS; OpenClaw's PAGER/GIT_PAGER "cat" exception stays);
//   - remote-shell programs (suffixes _SSH, _RSH);
//   - git's trace, config, ssh, redirect and test variables (GIT_TRACE*
//     append-writes any file, GIT_CONFIG* sets any configuration);
//   - less (LESS, LESSOPEN, LESSKEY*, LESSSECURE, …), man (MANOPT,
//     MANROFFOPT, MANROFFSEQ) and groff (GROFF_*);
//   - interpreter options and library paths: PERL*, PYTHON* (except a few
//     that only change buffering, encoding and hashing), RUBY*, AWKPATH,
//     AWKLIBPATH, VIM, VIMRUNTIME;
//   - tool option variables that name programs: TAR_OPTIONS, TAPE (a
//     host:file tape runs rsh), ZIPOPT;
//   - locale and message catalog paths (LOCPATH, NLSPATH, TEXTDOMAINDIR,
//     I18NPATH), shell prompts and readline (PS0–PS3, INPUTRC), sanitizer
//     options (log_path writes, external_symbolizer_path runs) and
//     profiling outputs (LLVM_PROFILE_FILE, GCOV_PREFIX, MALLOC_TRACE).
//
// Tables are upper-case and sorted, like OpenClaw's.

// execmeshBlockedOverrideKeys are refused as request overrides.
var execmeshBlockedOverrideKeys = []string{
	"ASAN_OPTIONS",
	"AWKLIBPATH",
	"AWKPATH",
	"GCOV_PREFIX",
	"GIT_MAN_VIEWER",
	"I18NPATH",
	"INPUTRC",
	"LLVM_PROFILE_FILE",
	"LOCPATH",
	"LSAN_OPTIONS",
	"MALLOC_TRACE",
	"MANOPT",
	"MANROFFOPT",
	"MANROFFSEQ",
	"MSAN_OPTIONS",
	"NLSPATH",
	"PS0",
	"PS1",
	"PS2",
	"PS3",
	"SYSTEMD_LESS",
	"SYSTEMD_PAGERSECURE",
	"TAPE",
	"TAR_OPTIONS",
	"TEXTDOMAINDIR",
	"TSAN_OPTIONS",
	"UBSAN_OPTIONS",
	"VIM",
	"VIMRUNTIME",
	"ZIPOPT",
}

// execmeshBlockedOverridePrefixes block every request override they start.
var execmeshBlockedOverridePrefixes = []string{
	"GIT_CONFIG",
	"GIT_REDIRECT_",
	"GIT_SSH",
	"GIT_TEST_",
	"GIT_TRACE",
	"GROFF_",
	"LESS",
	"PERL",
	"PYTHON",
	"RUBY",
}

// execmeshBlockedOverrideSuffixes block every request override they end.
var execmeshBlockedOverrideSuffixes = []string{
	"ASKPASS",
	"EDITOR",
	"PAGER",
	"_RSH",
	"_SSH",
}

// execmeshAllowedOverrideKeys are exceptions to the prefixes: Python
// variables that only change buffering, encoding, hashing or which paths
// are searched (only ever fewer).
var execmeshAllowedOverrideKeys = []string{
	"PYTHONDONTWRITEBYTECODE",
	"PYTHONHASHSEED",
	"PYTHONIOENCODING",
	"PYTHONNOUSERSITE",
	"PYTHONSAFEPATH",
	"PYTHONUNBUFFERED",
	"PYTHONUTF8",
}

// IsExecmeshBlockedOverrideVarName reports whether execmesh refuses key as
// a request override on top of OpenClaw's lists (see above). The key is
// trimmed and compared case-insensitively. PAGER and GIT_PAGER are left to
// OpenClaw's rule (blocked unless the value is "" or "cat").
func IsExecmeshBlockedOverrideVarName(key string) bool {
	upper, ok := normalizedUpper(key)
	return ok && isExecmeshBlocked(upper)
}

func isExecmeshBlocked(upper string) bool {
	switch {
	case upper == "PAGER" || upper == "GIT_PAGER":
		return false
	case inTable(execmeshAllowedOverrideKeys, upper):
		return false
	case inTable(execmeshBlockedOverrideKeys, upper), hasAnyPrefix(upper, execmeshBlockedOverridePrefixes):
		return true
	}
	for _, s := range execmeshBlockedOverrideSuffixes {
		if strings.HasSuffix(upper, s) {
			return true
		}
	}
	return false
}
