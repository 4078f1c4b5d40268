// Finding a connection's socket by its endpoints and noticing that the peer closed it (the
// non-streaming disconnect check), on real loopback TCP connections.
#include "server/peer_socket.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

namespace sparkserve {
namespace {

int port_of(int fd, bool peer) {
  sockaddr_in a{};
  socklen_t n = sizeof a;
  int rc = peer ? getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) : getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n);
  EXPECT_EQ(rc, 0);
  return ntohs(a.sin_port);
}

struct Connection {
  int listener = -1, client = -1, server = -1;
  Connection() {
    listener = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    EXPECT_EQ(listen(listener, 4), 0);
    a.sin_port = htons(static_cast<uint16_t>(port_of(listener, false)));
    client = socket(AF_INET, SOCK_STREAM, 0);
    EXPECT_EQ(connect(client, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    server = accept(listener, nullptr, nullptr);
    EXPECT_GE(server, 0);
  }
  ~Connection() {
    for (int fd : {listener, client, server})
      if (fd >= 0) close(fd);
  }
};

TEST(PeerSocket, FindsTheConnectionByItsEndpoints) {
  Connection a, b;  // two connections to different listeners: each found, not the other
  EXPECT_EQ(find_connection_socket(port_of(a.server, false), "127.0.0.1", port_of(a.client, false)), a.server);
  EXPECT_EQ(find_connection_socket(port_of(b.server, false), "127.0.0.1", port_of(b.client, false)), b.server);
  EXPECT_EQ(find_connection_socket(port_of(a.server, false), "127.0.0.2", port_of(a.client, false)), -1);
  EXPECT_EQ(find_connection_socket(port_of(a.server, false), "127.0.0.1", port_of(b.client, false)), -1);
  EXPECT_EQ(find_connection_socket(-1, "127.0.0.1", 5), -1);
}

TEST(PeerSocket, ClosedPeerIsNoticedAndUnreadDataIsNot) {
  Connection c;
  EXPECT_FALSE(peer_closed(c.server));
  ASSERT_EQ(write(c.client, "GET", 3), 3);  // a pipelined request: data, not a close
  usleep(20000);
  EXPECT_FALSE(peer_closed(c.server));
  char buf[3];
  ASSERT_EQ(recv(c.server, buf, 3, MSG_PEEK), 3);  // nothing was consumed
  close(c.client);
  c.client = -1;
  usleep(20000);
  EXPECT_TRUE(peer_closed(c.server));
  EXPECT_FALSE(peer_closed(-1));
}

}  // namespace
}  // namespace sparkserve
