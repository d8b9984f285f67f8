#!/bin/sh
# Makes the TLS material every TLS test uses, with OpenSSL, into DIR:
#   ca.crt ca.key              a throwaway test CA
#   server.crt server.key      for localhost, 127.0.0.1 and ::1, signed by the CA
#   wronghost.crt wronghost.key  signed by the CA, but for wrong.invalid only
#   expired.crt expired.key    for localhost, expired yesterday
#   selfsigned.crt selfsigned.key  for localhost, signed by nobody the CA knows
#   client.crt client.key      a client certificate signed by the CA (mutual TLS)
#   other-ca.crt               a CA that signed none of these
# Usage: tests/support/make_certs.sh DIR   (idempotent: does nothing when DIR
# already holds them all). Keys are RSA 2048, certificates valid 2 days.
set -eu
dir=$1
mkdir -p "$dir"
cd "$dir"
[ -f done ] && exit 0
q() { "$@" >/dev/null 2>&1 || { echo "make_certs.sh: failed: $*" >&2; exit 1; }; }
key() { q openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1.key"; }
csr() { q openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=$2"; }
# Python 3.13's default context verifies strictly (VERIFY_X509_STRICT): a
# CA's certificate must state its key usage, a leaf name its issuer's key.
sign() {  # name days extfile-line
    printf '%s\n' "$3" "authorityKeyIdentifier=keyid,issuer" > "$1.ext"
    q openssl x509 -req -in "$1.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -out "$1.crt" \
        -days "$2" -extfile "$1.ext"
    rm -f "$1.csr" "$1.ext"
}
key ca
q openssl req -x509 -new -key ca.key -out ca.crt -days 2 -subj "/CN=hirate test CA" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"
key other-ca
q openssl req -x509 -new -key other-ca.key -out other-ca.crt -days 2 -subj "/CN=hirate other CA" \
    -addext "keyUsage=critical,keyCertSign,cRLSign"
rm -f other-ca.key
key server; csr server localhost
sign server 2 "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
key wronghost; csr wronghost wrong.invalid
sign wronghost 2 "subjectAltName=DNS:wrong.invalid"
key expired; csr expired localhost
sign expired -1 "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
key selfsigned
q openssl req -x509 -new -key selfsigned.key -out selfsigned.crt -days 2 -subj "/CN=localhost" \
    -addext "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
key client; csr client "hirate test client"
sign client 2 "extendedKeyUsage=clientAuth"
chmod 644 ./*.key
touch done
