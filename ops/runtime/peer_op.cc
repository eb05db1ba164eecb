#include "peer_op.h"

namespace kungfu {

void send_request(Transport &transport, OpRegistry *registry, int peer, FrameHeader h, const std::string &name,
                  const std::string &id, std::shared_ptr<PeerOp> op) {
  auto payload = std::make_shared<std::string>(id);
  transport.send(peer, h, name, payload->data(), payload->size(), payload, [op, registry, id](const Status &st) {
    if (!st.ok()) {
      registry->remove(id);
      op->complete(st);
    }
  });
}

}  // namespace kungfu
