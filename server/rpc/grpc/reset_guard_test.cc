#include "server/rpc/grpc/reset_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace softmax::server {
namespace {

TEST(PrematureResetGuardTest, ClosesAPeerAtTheLimitAndOnlyThatPeer) {
  std::vector<std::string> closed;
  PrematureResetGuard guard([&closed](absl::string_view peer) {
    closed.emplace_back(peer);
    return true;
  });
  for (int i = 0; i < kMaxPrematureResets - 1; ++i) {
    EXPECT_FALSE(guard.RecordPrematureReset("ipv4:10.0.0.1:1000"));
    EXPECT_FALSE(guard.RecordPrematureReset("ipv4:10.0.0.2:2000"));
  }
  EXPECT_TRUE(closed.empty());
  EXPECT_TRUE(guard.RecordPrematureReset("ipv4:10.0.0.1:1000"));
  EXPECT_EQ(closed, std::vector<std::string>{"ipv4:10.0.0.1:1000"});
  EXPECT_EQ(guard.connections_closed(), 1);
  // The other peer's count was its own; the closed one starts again.
  EXPECT_TRUE(guard.RecordPrematureReset("ipv4:10.0.0.2:2000"));
  EXPECT_FALSE(guard.RecordPrematureReset("ipv4:10.0.0.1:1000"));
  EXPECT_EQ(guard.connections_closed(), 2);
}

// A loopback TCP connection: the accepted end (the server's) and the client's.
struct Loopback {
  int listener = -1, client = -1, accepted = -1;
  Loopback() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof(address);
    bind(listener, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    listen(listener, 1);
    getsockname(listener, reinterpret_cast<sockaddr*>(&address), &length);
    client = socket(AF_INET, SOCK_STREAM, 0);
    connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address));
    accepted = accept(listener, nullptr, nullptr);
  }
  ~Loopback() {
    for (int fd : {listener, client, accepted}) {
      if (fd >= 0) close(fd);
    }
  }
  int ClientPort() const {
    sockaddr_in address{};
    socklen_t length = sizeof(address);
    getsockname(client, reinterpret_cast<sockaddr*>(&address), &length);
    return ntohs(address.sin_port);
  }
};

TEST(ShutdownPeerConnectionTest, FindsTheSocketByGrpcsPeerNameAndResetsIt) {
  Loopback connection;
  ASSERT_GE(connection.accepted, 0);
  const std::string peer = absl::StrCat("ipv4:127.0.0.1:", connection.ClientPort());
  EXPECT_EQ(PeerName(connection.accepted), peer);
  EXPECT_FALSE(ShutdownPeerConnection("ipv4:127.0.0.1:1"));
  ASSERT_TRUE(ShutdownPeerConnection(peer));
  // The server's end reads end-of-stream now (what makes gRPC drop the
  // connection), and the client sees the connection end.
  char byte = 0;
  EXPECT_EQ(recv(connection.accepted, &byte, 1, 0), 0);
  close(connection.accepted);
  connection.accepted = -1;
  EXPECT_LE(recv(connection.client, &byte, 1, 0), 0);
}

}  // namespace
}  // namespace softmax::server
