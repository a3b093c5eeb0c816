// Which wgmma instruction widths a Hopper kernel's CUTLASS headers may pick.
#pragma once
#include <string>

namespace evtc::sm90 {

// Hopper's wgmma computes 64×N×16 for every N from 8 to 256 in steps of 8, but CUTLASS's
// instruction selector (cute::SM90::GMMA::ss_op_selector) offers only N = 256, 192, 128, 96, 64,
// 32, 16 and 8 unless CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED is defined. A tile whose width is
// none of those nor a multiple of 64 or 96 (48, 80, 112, 144, 160, 208, 224, ...) then runs as 16-
// or 32-column wgmmas, each of which reads the whole A tile from shared memory again. Measured on
// an H100 at 1024×3584×4096 (Nsight Compute): ping-pong 128×112 issued 4.2× the instructions of
// 128×128 and took 108 µs against 54. The define gives such tiles one wgmma of the tile's width.
// Tiles whose width the default instructions already cover get the same instruction either way,
// so their sources (and cache keys) stay without it.
inline bool needs_extended_wgmma_widths(int tile_n) {
  // The selector takes the widest instruction whose N divides the tile's width.
  auto widest = [tile_n](bool extended) {
    for (int n = 256; n >= 8; n -= 8) {
      const bool default_width = n == 256 || n == 192 || n == 128 || n == 96 || n == 64 || n == 32 || n == 16 || n == 8;
      if ((extended || default_width) && tile_n % n == 0) return n;
    }
    return 0;
  };
  return widest(true) != widest(false);
}

// The line the generated source starts its CUTLASS includes with ("" where none is needed).
inline std::string extended_wgmma_widths_define(int tile_n) {
  return needs_extended_wgmma_widths(tile_n) ? "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1\n" : "";
}

}  // namespace evtc::sm90
