/* Loaded under the soname libssl.so (see civetweb_tls.h): the OpenSSL 1.1
 * function Debian 12's civetweb looks up and OpenSSL 3 no longer exports.
 * Everything else civetweb looks up resolves through this library's
 * dependency on the real libssl.so.3. */
#include <openssl/ssl.h>

/* A macro for SSL_get1_peer_certificate since OpenSSL 3.0; the same
 * contract (the caller frees the certificate). */
#undef SSL_get_peer_certificate
X509 *SSL_get_peer_certificate(const SSL *ssl);
X509 *SSL_get_peer_certificate(const SSL *ssl) { return SSL_get1_peer_certificate(ssl); }
