// TLS for the civetweb HTTP endpoint: loading OpenSSL into Debian 12's
// civetweb, and configuring a civetweb server's SSL_CTX from the same PEM
// files as gRPC's (--tls_cert_file, --tls_key_file, --tls_client_ca_file).
//
// Debian 12's civetweb (1.15) loads OpenSSL at run time by the names
// libssl.so and libcrypto.so and expects OpenSSL 1.1's functions; OpenSSL 3
// no longer exports SSL_get_peer_certificate (a macro since 3.0), so the
// load fails. Asked for a TLS port anyway, that civetweb starts and then
// calls a null function pointer on the first connection. The cure: two
// libraries built here (civetweb_openssl/), whose sonames are the names
// civetweb asks for, are loaded first; glibc's dlopen returns an object
// already loaded under the soname asked for, so civetweb gets them, and
// through their dependencies the real libssl.so.3 and libcrypto.so.3.
//
// Thread-safety: EnableCivetwebTls is not reentrant (civetweb's
// mg_init_library is not); call it before starting a TLS server.
#ifndef SOFTMAX_SERVER_RPC_HTTP_CIVETWEB_TLS_H_
#define SOFTMAX_SERVER_RPC_HTTP_CIVETWEB_TLS_H_

#include <string>

#include "absl/status/status.h"

namespace softmax::server {

// The PEM files of a TLS listener; as GrpcServerOptions' tls_* fields.
struct TlsFiles {
  std::string cert_file;       // certificate chain, leaf first
  std::string key_file;        // its private key
  std::string client_ca_file;  // when set, clients must present a certificate it signed
};

// Loads the compatibility libraries from the lib/ folder beside the
// executable's bin/ folder and initialises civetweb's TLS. UNAVAILABLE,
// naming what is missing, when that fails. Once per process; later calls
// return the first call's result.
absl::Status EnableCivetwebTls();

// Configures `ssl_ctx` (an SSL_CTX* from civetweb's init_ssl callback):
// certificate chain and key, TLS 1.2 or newer, and with a client CA, a
// verified client certificate required. INVALID_ARGUMENT naming the flag
// whose file is unreadable or wrong.
absl::Status ConfigureTlsContext(void* ssl_ctx, const TlsFiles& files);

// Checks that `files` make a working TLS server (readable PEM, the key the
// certificate's, a CA file with certificates) with OpenSSL, as
// ConfigureTlsContext would; for a clear error at start naming the flag.
absl::Status CheckTlsFiles(const TlsFiles& files);

}  // namespace softmax::server

#endif  // SOFTMAX_SERVER_RPC_HTTP_CIVETWEB_TLS_H_
