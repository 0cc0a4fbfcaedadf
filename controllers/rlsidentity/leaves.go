package rlsidentity

import (
	"fmt"
	"time"

	"github.com/floodgate-dev/floodgate/internal/pki"
	"github.com/floodgate-dev/floodgate/sidecar/config"
)

// ServingLeaf is the serving certificate of the central rate-limit
// service reached as the Service service of namespace namespace: its
// names <service>.<namespace>.svc and <service>.<namespace>.svc.<domain>
// (cluster.local when empty), which the gateways' configuration checks.
func ServingLeaf(service, namespace, clusterDomain string) pki.Leaf {
	if clusterDomain == "" {
		clusterDomain = "cluster.local"
	}
	short := service + "." + namespace + ".svc"
	return pki.Leaf{CommonName: short, Hosts: []string{short, short + "." + clusterDomain}, Usage: pki.Server}
}

// ClientLeaf is the client certificate of the Gateway namespace/name: its
// URI SAN is the gateway's identity (config.GatewayIdentity), which the
// central service reads to know which gateway calls.
func ClientLeaf(namespace, name string) pki.Leaf {
	return pki.Leaf{
		CommonName: config.GatewayRef(namespace, name),
		URIs:       []string{config.GatewayIdentity(namespace, name)},
		Usage:      pki.Client,
	}
}

// caName is the common name of a CA created at now.
func caName(now time.Time) string { return fmt.Sprintf("floodgate-ratelimit-ca@%d", now.Unix()) }
