#!/usr/bin/env bash
# make-test-ca.sh — a TEST-ONLY certificate authority for the execmesh NATS
# cluster (deploy/nats/cluster). It is for trying the cluster out and for
# the integration tests: the CA key sits unprotected next to the
# certificates. For production use your organisation's CA (or NATS's own
# tooling) and keep the CA key offline.
#
# usage: make-test-ca.sh OUT_DIR SERVER[,SAN...] [SERVER[,SAN...]...]
#
#   make-test-ca.sh ./tls nats-1,10.0.0.11 nats-2,10.0.0.12 nats-3,10.0.0.13
#
# writes, in OUT_DIR:
#   ca.pem, ca-key.pem            the CA (reused when ca.pem and ca-key.pem
#                                 exist, so servers can be added later)
#   SERVER.pem, SERVER-key.pem    one per SERVER argument: a server
#                                 certificate for DNS:SERVER plus every SAN
#                                 (IP addresses or DNS names), usable for
#                                 the client port and, with clientAuth, for
#                                 the cluster routes' mutual TLS
#   client.pem, client-key.pem    a client certificate (CN execmesh-client),
#                                 for tools that want one; the shipped
#                                 server configs do not require client
#                                 certificates
#
# Keys are EC P-256, certificates valid for DAYS days (default 365; set
# DAYS in the environment to change it). Needs openssl 1.1.1 or newer.
set -euo pipefail

usage() {
	sed -n '8,10p' "$0" >&2
	exit 2
}

[[ $# -ge 2 ]] || usage
out=$1
shift
days=${DAYS:-365}
[[ $days =~ ^[0-9]+$ ]] || { echo "make-test-ca.sh: DAYS must be a number of days, got '$days'" >&2; exit 2; }

command -v openssl >/dev/null || { echo "make-test-ca.sh: openssl not found" >&2; exit 1; }
mkdir -p "$out"
umask 077
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

serial() { echo "0x$(openssl rand -hex 16)"; }

newkey() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

# sign NAME SUBJECT EXTFILE: a certificate for OUT_DIR/NAME-key.pem
sign() {
	local name=$1 subject=$2 ext=$3
	newkey "$out/$name-key.pem"
	openssl req -new -key "$out/$name-key.pem" -subj "$subject" -out "$tmp/$name.csr"
	openssl x509 -req -in "$tmp/$name.csr" -CA "$out/ca.pem" -CAkey "$out/ca-key.pem" \
		-set_serial "$(serial)" -days "$days" -sha256 -extfile "$ext" -out "$out/$name.pem" 2>/dev/null
	chmod 0644 "$out/$name.pem"
}

if [[ -s $out/ca.pem && -s $out/ca-key.pem ]]; then
	echo "make-test-ca.sh: reusing the CA in $out" >&2
else
	newkey "$out/ca-key.pem"
	openssl req -x509 -new -key "$out/ca-key.pem" -subj "/O=execmesh test/CN=execmesh test CA" \
		-days "$days" -sha256 -set_serial "$(serial)" \
		-addext "basicConstraints=critical,CA:TRUE" \
		-addext "keyUsage=critical,keyCertSign,cRLSign" \
		-out "$out/ca.pem"
	chmod 0644 "$out/ca.pem"
fi

ip_re='^([0-9]{1,3}\.){3}[0-9]{1,3}$|:'
for spec in "$@"; do
	IFS=, read -r -a parts <<<"$spec"
	name=${parts[0]}
	[[ $name =~ ^[A-Za-z0-9][A-Za-z0-9.-]*$ ]] || { echo "make-test-ca.sh: bad server name '$name'" >&2; exit 2; }
	sans="DNS:$name"
	for san in "${parts[@]:1}"; do
		[[ -n $san ]] || continue
		if [[ $san =~ $ip_re ]]; then
			sans+=",IP:$san"
		else
			sans+=",DNS:$san"
		fi
	done
	cat >"$tmp/$name.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=$sans
EOF
	sign "$name" "/O=execmesh test/CN=$name" "$tmp/$name.ext"
	echo "make-test-ca.sh: $out/$name.pem ($sans)" >&2
done

cat >"$tmp/client.ext" <<EOF
basicConstraints=critical,CA:FALSE
keyUsage=critical,digitalSignature
extendedKeyUsage=clientAuth
EOF
sign client "/O=execmesh test/CN=execmesh-client" "$tmp/client.ext"
echo "make-test-ca.sh: $out/client.pem, CA $out/ca.pem (TEST ONLY)" >&2
