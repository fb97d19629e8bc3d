#include "server/rpc/auth.h"

#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace softmax::server {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

absl::StatusOr<std::vector<std::string>> ReadTokens(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::InvalidArgumentError(absl::StrCat("cannot read ", path));
  std::stringstream text;
  text << file.rdbuf();
  std::vector<std::string> tokens;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    tokens.emplace_back(line);
  }
  if (tokens.empty()) return absl::InvalidArgumentError(absl::StrCat(path, " holds no token"));
  return tokens;
}

}  // namespace

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  if (a.size() != b.size()) return false;
  volatile unsigned char difference = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    difference = difference | (static_cast<unsigned char>(a[i]) ^ static_cast<unsigned char>(b[i]));
  }
  return difference == 0;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::FromFile(
    const std::string& path) {
  std::unique_ptr<TokenAuthenticator> authenticator(new TokenAuthenticator(path));
  absl::Status status = authenticator->Reload();
  if (!status.ok()) return status;
  return authenticator;
}

absl::Status TokenAuthenticator::Reload() {
  absl::StatusOr<std::vector<std::string>> tokens = ReadTokens(path_);
  if (!tokens.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_tokens_file: ", tokens.status().message()));
  }
  absl::MutexLock lock(&mu_);
  tokens_ = std::move(*tokens);
  return absl::OkStatus();
}

absl::Status TokenAuthenticator::CheckHeader(absl::string_view authorization) const {
  if (!absl::ConsumePrefix(&authorization, kBearer)) {
    return absl::UnauthenticatedError("missing \"authorization: Bearer <token>\"");
  }
  bool known = false;
  absl::MutexLock lock(&mu_);
  // Every token is compared, so the time taken does not tell which matched.
  for (const std::string& token : tokens_) known |= ConstantTimeEquals(authorization, token);
  if (!known) return absl::UnauthenticatedError("unknown bearer token");
  return absl::OkStatus();
}

}  // namespace softmax::server
