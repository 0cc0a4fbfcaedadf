// Package rlsidentity keeps the identities of floodgate's central
// rate-limit service and of the gateways that call it, so that the
// service serves only authenticated gateways, each for its own policies
// (floodgate-sidecar --grpc-client-ca-file; see sidecar/envoyrls).
//
// # What it keeps
//
//   - A CA, in the Secret CASecretName of the manager's namespace (ca.crt,
//     the bundle every party trusts, and ca.key). Only the manager reads
//     it.
//   - The service's serving certificate, in the Secret ServingSecretName of
//     the manager's namespace (type kubernetes.io/tls: tls.crt, tls.key,
//     and ca.crt, the bundle its callers' certificates must verify
//     against), which the service's pods mount.
//   - A client certificate for each Gateway the manager is given, whose URI
//     SAN is the gateway's identity (config.GatewayIdentity,
//     spiffe://floodgate.dev/ns/<namespace>/gateway/<name>), in the Secret
//     ClientSecretName of the namespace where the gateway's pods run (the
//     Gateway's own namespace unless told otherwise: Envoy Gateway runs
//     its proxies in its controller's namespace). One Secret per namespace
//     holds the certificates of every gateway whose pods run there, under
//     keys named after the gateway (ClientKeys), with the CA bundle that
//     the service's certificate must verify against (ca.crt), and both in
//     the SDS files the generated gateway configuration reads
//     (gatewayconfig.ClientCertificateSDS, gatewayconfig.TrustedCASDS).
//     A gateway removed from the list loses its keys; a namespace left
//     without gateways loses the Secret.
//
// Every Secret is owned by the chart's mutating webhook configuration
// (OwnerWebhookConfig), so that uninstalling removes them, in every
// namespace.
//
// # Rotation without refused calls
//
// Certificates are renewed at two thirds of their life (by default the CA
// lives ten years and the others ninety days). A leaf certificate is
// simply reissued: every bundle already trusts its CA. A CA is rotated in
// stages, each waiting Policy.Propagation for the previous one to reach
// every pod (the kubelet updates Secret volumes; the service reads its
// files at each handshake, Envoy watches its directory):
//  1. the new CA joins every bundle ahead of the old one, signing nothing;
//  2. the serving certificate and every client certificate are reissued by
//     the new CA;
//  3. the old CA leaves the bundles.
//
// At every moment each party presents a certificate that the other's
// bundle trusts. Annotating the CA Secret floodgate.dev/rotate with any new
// value asks for the same staged rotation at once: the way to revoke the
// certificates of a gateway removed from the list before they expire.
//
// Only the elected leader keeps them (Manager is a leader-election
// runnable); writes carry the Secrets' resourceVersions, so a manager that
// lost the lead and wrote late loses the race and adopts the other's
// result.
package rlsidentity
