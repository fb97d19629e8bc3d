#include "server/rpc/http/civetweb_tls.h"

#include <civetweb.h>
#include <dlfcn.h>
#include <limits.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace softmax::server {
namespace {

// Loaded in this order: civetweb opens libcrypto.so first.
constexpr const char* kCompatLibraries[] = {"libsoftmax-civetweb-libcrypto.so",
                                            "libsoftmax-civetweb-libssl.so"};

// The lib/ folder beside the folder of this executable (build/bin and
// build/lib; bin/ and lib/ in the bundle).
std::string LibraryFolder() {
  char path[PATH_MAX];
  const ssize_t length = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (length <= 0) return "lib";
  std::string exe(path, static_cast<size_t>(length));
  const size_t bin = exe.rfind('/');
  const size_t parent = bin == std::string::npos || bin == 0 ? std::string::npos
                                                             : exe.rfind('/', bin - 1);
  return parent == std::string::npos ? "lib" : exe.substr(0, parent) + "/lib";
}

absl::Status LoadAndInitialise() {
  const std::string folder = LibraryFolder();
  for (const char* name : kCompatLibraries) {
    const std::string path = folder + "/" + name;
    // Kept loaded for the life of the process.
    if (dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) == nullptr) {
      return absl::UnavailableError(
          absl::StrCat("http: TLS needs ", path, " (built beside the server): ", dlerror()));
    }
  }
  if ((mg_init_library(MG_FEATURES_TLS) & MG_FEATURES_TLS) == 0) {
    return absl::UnavailableError("http: civetweb could not load OpenSSL");
  }
  return absl::OkStatus();
}

// OpenSSL's queued errors as one line, emptying the queue.
std::string OpenSslErrors() {
  std::string text;
  while (const unsigned long code = ERR_get_error()) {
    char line[256];
    ERR_error_string_n(code, line, sizeof(line));
    absl::StrAppend(&text, text.empty() ? "" : "; ", line);
  }
  return text.empty() ? "unknown error" : text;
}

absl::Status FileError(const char* flag, const std::string& path) {
  return absl::InvalidArgumentError(absl::StrCat(flag, ": ", path, ": ", OpenSslErrors()));
}

}  // namespace

absl::Status EnableCivetwebTls() {
  static const absl::Status* const status = new absl::Status(LoadAndInitialise());
  return *status;
}

absl::Status ConfigureTlsContext(void* ssl_ctx, const TlsFiles& files) {
  auto* context = static_cast<SSL_CTX*>(ssl_ctx);
  ERR_clear_error();
  if (SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION) != 1) {
    return absl::InternalError(absl::StrCat("http: TLS 1.2: ", OpenSslErrors()));
  }
  if (SSL_CTX_use_certificate_chain_file(context, files.cert_file.c_str()) != 1) {
    return FileError("--tls_cert_file", files.cert_file);
  }
  if (SSL_CTX_use_PrivateKey_file(context, files.key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return FileError("--tls_key_file", files.key_file);
  }
  if (SSL_CTX_check_private_key(context) != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--tls_key_file: ", files.key_file, " is not the key of ",
                     files.cert_file, ": ", OpenSslErrors()));
  }
  if (!files.client_ca_file.empty()) {
    STACK_OF(X509_NAME)* names = SSL_load_client_CA_file(files.client_ca_file.c_str());
    if (names == nullptr ||
        SSL_CTX_load_verify_locations(context, files.client_ca_file.c_str(), nullptr) != 1) {
      if (names != nullptr) sk_X509_NAME_pop_free(names, X509_NAME_free);
      return FileError("--tls_client_ca_file", files.client_ca_file);
    }
    SSL_CTX_set_client_CA_list(context, names);  // takes ownership
    SSL_CTX_set_verify(context, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  }
  // Sessions resumed by a verified client must not be resumed in another
  // context; OpenSSL refuses resumption with client verification without it.
  static constexpr unsigned char kSessionContext[] = "softmax-serve-http";
  SSL_CTX_set_session_id_context(context, kSessionContext, sizeof(kSessionContext) - 1);
  return absl::OkStatus();
}

absl::Status CheckTlsFiles(const TlsFiles& files) {
  SSL_CTX* context = SSL_CTX_new(TLS_server_method());
  if (context == nullptr) return absl::InternalError(absl::StrCat("TLS: ", OpenSslErrors()));
  absl::Status status = ConfigureTlsContext(context, files);
  SSL_CTX_free(context);
  return status;
}

}  // namespace softmax::server
