/* Loaded under the soname libcrypto.so (see civetweb_tls.h): no code, only a
 * dependency on the real libcrypto.so.3, so civetweb finds OpenSSL's crypto
 * library without the unversioned name libssl-dev installs. */
int softmax_civetweb_libcrypto_alias;
