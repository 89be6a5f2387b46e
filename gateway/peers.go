package gateway

import (
	"fmt"

	"github.com/execmesh/execmesh/host"
	"github.com/execmesh/execmesh/nodes"
	"github.com/execmesh/execmesh/protocol"
)

// gatewayHost returns the local host of another gateway, which holds a
// host=gateway session started through it.
func (g *Gateway) gatewayHost(id string) (host.Host, *nodes.Node, error) {
	return nil, nil, &protocol.Error{Type: protocol.ErrUnavailable, Retryable: true,
		Message: fmt.Sprintf("the session runs on the host of gateway %s; call that gateway", id)}
}
