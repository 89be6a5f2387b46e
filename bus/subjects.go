package bus

import (
	"fmt"

	"github.com/execmesh/execmesh/protocol"
)

// DefaultPrefix is the first token of every execmesh subject unless a
// deployment chooses another (protocol.DefaultSubjectPrefix); several
// installations can share one NATS system by using different prefixes.
const DefaultPrefix = protocol.DefaultSubjectPrefix

// NodeServiceName is the micro service name node agents register
// (STYLE §5). NodePermissions lets a node answer $SRV discovery requests
// for this name only.
const NodeServiceName = "execmesh-node"

// Subjects come from protocol.Subjects (see the package doc for the
// layout); these are the few bus-only names.
func subjKV(bucket, key string) string    { return "$KV." + bucket + "." + key }
func subjStreamInfo(stream string) string { return "$JS.API.STREAM.INFO." + stream }
func nodeInboxPrefix(id string) string    { return "_INBOX.c-" + id }
func subjSrv(verb, name, id string) string {
	return "$SRV." + verb + "." + name + "." + id
}
func subjSrvName(verb, name string) string { return "$SRV." + verb + "." + name }

// validPrefix checks a subject prefix with protocol's rule: one token of
// letters, digits, '-' or '_'.
func validPrefix(p string) error {
	if err := protocol.ValidateSubjectPrefix(p); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	return nil
}

// validID checks a node id or a join user name with protocol's node id
// rule. Ids end up in permissions, where a crafted id such as "*" would
// widen the grant.
func validID(id string) error {
	if err := protocol.ValidateNodeID(id); err != nil {
		return fmt.Errorf("bus: %w", err)
	}
	return nil
}
