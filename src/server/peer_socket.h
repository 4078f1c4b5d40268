// Noticing that the client of a non-streaming request went away. cpp-httplib 0.11 gives a
// handler no socket and no is_connection_closed(), only the connection's addresses, so the
// handler finds its socket among the process's descriptors by (local port, peer address, peer
// port) (a TCP connection is unique by these) and polls it while it waits for the engine.
#pragma once

#include <string>

namespace sparkserve {

// The descriptor of the connected socket with these endpoints, or -1 when none matches.
int find_connection_socket(int local_port, const std::string& remote_addr, int remote_port);

// True when the peer closed its side (or the socket failed). A client that half-closes
// (shutdown(SHUT_WR)) while still reading counts as gone: HTTP clients do not do that.
// Never blocks and never consumes data.
bool peer_closed(int fd);

}  // namespace sparkserve
