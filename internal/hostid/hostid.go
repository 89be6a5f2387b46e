// Package hostid names the view of the file system a process has, so that
// two processes can tell whether a path means the same thing to both.
//
// The ID is a digest of the kernel's boot id and the process's mount
// namespace: processes on the same machine, in the same boot and the same
// mount namespace (not in different containers) see the same files at the
// same paths. The gateway reports its ID in GET /healthz; `execmesh exec`
// compares it with its own to decide whether its working directory means
// anything to the gateway. The digest reveals neither the boot id nor the
// namespace.
package hostid

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// Paths read by ID (Linux).
const (
	bootIDPath  = "/proc/sys/kernel/random/boot_id"
	mountNSPath = "/proc/self/ns/mnt"
)

// ID returns the host id of the calling process: 32 hex digits. It fails
// where /proc does not tell the boot id or the mount namespace.
func ID() (string, error) {
	boot, err := os.ReadFile(bootIDPath)
	if err != nil {
		return "", fmt.Errorf("hostid: %w", err)
	}
	mnt, err := os.Readlink(mountNSPath)
	if err != nil {
		return "", fmt.Errorf("hostid: %w", err)
	}
	return Of(strings.TrimSpace(string(boot)), mnt), nil
}

// Of is the host id of a boot id and a mount namespace ("mnt:[4026531840]").
func Of(bootID, mountNS string) string {
	sum := sha256.Sum256([]byte("execmesh-host-id\x00" + bootID + "\x00" + mountNS))
	return hex.EncodeToString(sum[:16])
}
