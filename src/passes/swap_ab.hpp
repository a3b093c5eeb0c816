// swap_ab: the same GEMM and epilogue computed transposed (declared in evtc/passes.hpp).
#pragma once
#include "evtc/passes.hpp"
