// TokenAuthenticator and ConstantTimeEquals without a server: a token is
// accepted only when it equals a listed one byte for byte.
#include "server/rpc/auth.h"

#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include <gtest/gtest.h>

namespace softmax::server {
namespace {

// A token file in the test's temporary folder, removed at the end.
class TokenFile {
 public:
  explicit TokenFile(const std::string& text) {
    path_ = ::testing::TempDir() + "auth_test_tokens_XXXXXX";
    const int fd = mkstemp(path_.data());
    EXPECT_GE(fd, 0);
    if (fd >= 0) close(fd);
    Write(text);
  }
  ~TokenFile() { unlink(path_.c_str()); }
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  void Write(const std::string& text) { std::ofstream(path_, std::ios::trunc) << text; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::unique_ptr<TokenAuthenticator> Load(const TokenFile& file) {
  absl::StatusOr<std::unique_ptr<TokenAuthenticator>> authenticator =
      TokenAuthenticator::FromFile(file.path());
  EXPECT_TRUE(authenticator.ok()) << authenticator.status();
  return authenticator.ok() ? std::move(*authenticator) : nullptr;
}

TEST(ConstantTimeEqualsTest, EqualOnlyForTheSameBytesAndLength) {
  EXPECT_TRUE(ConstantTimeEquals("", ""));
  EXPECT_TRUE(ConstantTimeEquals("token", "token"));
  EXPECT_FALSE(ConstantTimeEquals("token", "tokeN"));
  EXPECT_FALSE(ConstantTimeEquals("token", "token-and-more"));
  EXPECT_FALSE(ConstantTimeEquals("token-and-more", "token"));
  EXPECT_FALSE(ConstantTimeEquals("token", ""));
  EXPECT_FALSE(ConstantTimeEquals("", "token"));
  EXPECT_FALSE(ConstantTimeEquals(std::string("tok\0n", 5), "token"));
}

// A token that begins with a known token and goes on is someone else's (or a
// guess built on a leaked prefix): refused, as is every near miss.
TEST(TokenAuthenticatorTest, AcceptsOnlyAnExactKnownToken) {
  TokenFile file("# the tokens\nfirst-token\n\n  second-token \t\n");
  std::unique_ptr<TokenAuthenticator> authenticator = Load(file);
  ASSERT_NE(authenticator, nullptr);
  EXPECT_TRUE(authenticator->CheckHeader("Bearer first-token").ok());
  // Whitespace around a token in the file is not part of it.
  EXPECT_TRUE(authenticator->CheckHeader("Bearer second-token").ok());
  for (const char* refused : {
           "Bearer first-tokenX",           // a known token and a suffix
           "Bearer first-token-and-more",   // likewise
           "Bearer second-tokenfirst-token",
           "Bearer first-toke",             // a prefix of a known token
           "Bearer f",
           "Bearer ",                       // empty
           "",
           "Bearer",
           "Bearer FIRST-TOKEN",            // tokens are case-sensitive
           "Bearer First-token",
           "Bearer  first-token",           // whitespace is not trimmed
           "Bearer first-token ",
           " Bearer first-token",
           "Bearer first-token\n",
           "first-token",                   // no scheme
           "Basic first-token",
           "Bearer # the tokens",           // comments are not tokens
       }) {
    const absl::Status status = authenticator->CheckHeader(refused);
    EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated) << '"' << refused << '"';
  }
  EXPECT_EQ(authenticator->CheckHeader(std::string("Bearer first-token\0X", 20)).code(),
            absl::StatusCode::kUnauthenticated);
}

TEST(TokenAuthenticatorTest, ReloadReplacesTheTokensAndAFailedReloadKeepsThem) {
  TokenFile file("old-token\n");
  std::unique_ptr<TokenAuthenticator> authenticator = Load(file);
  ASSERT_NE(authenticator, nullptr);
  file.Write("new-token\n");
  ASSERT_TRUE(authenticator->Reload().ok());
  EXPECT_TRUE(authenticator->CheckHeader("Bearer new-token").ok());
  EXPECT_EQ(authenticator->CheckHeader("Bearer old-token").code(),
            absl::StatusCode::kUnauthenticated);
  // A file with no token left is refused, naming the flag; the tokens stay.
  file.Write("# nothing\n\n");
  const absl::Status reloaded = authenticator->Reload();
  EXPECT_EQ(reloaded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(reloaded.message().find("--auth_tokens_file"), absl::string_view::npos) << reloaded;
  EXPECT_TRUE(authenticator->CheckHeader("Bearer new-token").ok());
  EXPECT_EQ(authenticator->CheckHeader("Bearer ").code(), absl::StatusCode::kUnauthenticated);
}

TEST(TokenAuthenticatorTest, AFileWithoutTokensOrUnreadableIsInvalidArgument) {
  TokenFile empty("\n# only a comment\n   \n");
  EXPECT_EQ(TokenAuthenticator::FromFile(empty.path()).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(TokenAuthenticator::FromFile(empty.path() + ".missing").status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace softmax::server
