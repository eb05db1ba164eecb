#include "frame.h"

namespace kungfu {

Status check_frame_header(const FrameHeader &header) {
  if (header.magic != kFrameMagic) {
    return InvalidArgument("malformed frame header: magic " + std::to_string(header.magic) + ", expected " +
                           std::to_string(kFrameMagic));
  }
  if (header.key_len > kMaxKeyLen) {
    return InvalidArgument("malformed frame header: key_len " + std::to_string(header.key_len) + " > " +
                           std::to_string(kMaxKeyLen));
  }
  if (header.ndims > kMaxDims) {
    return InvalidArgument("malformed frame header: ndims " + std::to_string(header.ndims) + " > " +
                           std::to_string(kMaxDims));
  }
  return Status::OK();
}

}  // namespace kungfu
