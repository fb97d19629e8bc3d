#include "server/listening_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace softmax::server {
namespace {

// `text` as a JSON string literal.
std::string Quoted(const std::string& text) {
  std::string out = "\"";
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<unsigned char>(c));
    } else {
      out += c;
    }
  }
  return out + "\"";
}

absl::Status Failed(const std::string& path, const std::string& what, int error) {
  return absl::FailedPreconditionError(
      absl::StrCat("--listening_file=", path, ": cannot ", what, ": ", std::strerror(error)));
}

}  // namespace

std::string ListeningJson(const ListeningInfo& info) {
  return absl::StrCat("{\"grpc\": ", Quoted(info.grpc), ", \"http\": ", Quoted(info.http),
                      ", \"metrics\": ", Quoted(info.metrics), ", \"pid\": ", info.pid,
                      ", \"version\": ", Quoted(info.version),
                      ", \"revision\": ", Quoted(info.revision), "}\n");
}

absl::Status WriteListeningFile(const std::string& path, const ListeningInfo& info) {
  const std::string temporary = absl::StrCat(path, ".tmp.", info.pid);
  const int fd = open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Failed(path, absl::StrCat("create ", temporary), errno);
  const std::string text = ListeningJson(info);
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = errno;
      close(fd);
      unlink(temporary.c_str());
      return Failed(path, absl::StrCat("write ", temporary), error);
    }
    written += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return Failed(path, absl::StrCat("write ", temporary), error);
  }
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const int error = errno;
    unlink(temporary.c_str());
    return Failed(path, "rename the written file onto it", error);
  }
  return absl::OkStatus();
}

}  // namespace softmax::server
