// place_operand and matrix_layout: the placement rules the PyTorch layer applies to framework
// tensors (at trace time and in its ops at run time).
#include <gtest/gtest.h>

#include <vector>

#include "evtc/gemm.hpp"
#include "evtc/passes.hpp"

namespace evtc {
namespace {

using V = std::vector<int64_t>;

OperandPlacement place(V sizes, V strides, V full) { return place_operand(sizes, strides, full); }

TEST(OperandPlacement, BroadcastShapesGiveVectorsAndScalars) {
  EXPECT_EQ(place({}, {}, {8, 4, 16}).load, LoadClass::scalar);
  EXPECT_EQ(place({1}, {1}, {32, 16}).load, LoadClass::scalar);
  EXPECT_EQ(place({16}, {1}, {8, 4, 16}).load, LoadClass::row_vec);          // a bias
  EXPECT_EQ(place({1, 1, 16}, {16, 16, 1}, {8, 4, 16}).load, LoadClass::row_vec);
  EXPECT_EQ(place({8, 4, 1}, {4, 1, 1}, {8, 4, 16}).load, LoadClass::col_vec);  // a per-row scale
  EXPECT_EQ(place({32, 1}, {1, 1}, {32, 16}).load, LoadClass::col_vec);
  EXPECT_FALSE(place({32, 1}, {1, 1}, {32, 16}).needs_copy);
}

TEST(OperandPlacement, FullOperandsByTheirStrides) {
  EXPECT_EQ(place({32, 16}, {16, 1}, {32, 16}).load, LoadClass::aux_row_major);
  EXPECT_EQ(place({32, 16}, {1, 32}, {32, 16}).load, LoadClass::aux_col_major);
  EXPECT_EQ(place({8, 4, 16}, {64, 16, 1}, {8, 4, 16}).load, LoadClass::aux_row_major);
  const OperandPlacement strided = place({32, 16}, {32, 2}, {32, 16});  // every other column
  EXPECT_EQ(strided.load, LoadClass::aux_row_major);
  EXPECT_TRUE(strided.needs_copy);
  EXPECT_TRUE(place({16}, {2}, {32, 16}).needs_copy);  // a row vector with a stride
}

TEST(OperandPlacement, RefusalsSayWhy) {
  const OperandPlacement partial = place({1, 4, 16}, {64, 16, 1}, {8, 4, 16});
  EXPECT_EQ(partial.load, LoadClass::not_fusable);
  EXPECT_NE(partial.why.find("broadcasts over part of the rows"), std::string::npos) << partial.why;
  const OperandPlacement wrong = place({15}, {1}, {8, 16});
  EXPECT_EQ(wrong.load, LoadClass::not_fusable);
  EXPECT_NE(wrong.why.find("does not broadcast to [8, 16]"), std::string::npos) << wrong.why;
  EXPECT_NE(place({2, 8, 16}, {128, 16, 1}, {8, 16}).why.find("more dimensions"), std::string::npos);
}

TEST(OperandPlacement, MoreLeadingDimensionsOfTheSameRowsFlatten) {
  // A training graph's saved [4, 1024, N] activation beside its backward's [4096, N] GEMM result.
  const OperandPlacement same = place({4, 1024, 16}, {1024 * 16, 16, 1}, {4096, 16});
  EXPECT_EQ(same.load, LoadClass::aux_row_major);
  EXPECT_FALSE(same.needs_copy);
  EXPECT_EQ(place({4, 1024, 1}, {1024, 1, 1}, {4096, 16}).load, LoadClass::col_vec);
  EXPECT_EQ(place({1, 1, 16}, {16, 16, 1}, {16}).load, LoadClass::row_vec);
  // Rows whose strides do not nest: read through a copy (the op library's reshape makes one).
  const OperandPlacement gapped = place({4, 1024, 16}, {2 * 1024 * 16, 16, 1}, {4096, 16});
  EXPECT_EQ(gapped.load, LoadClass::aux_row_major);
  EXPECT_TRUE(gapped.needs_copy);
  // Other rows, or another N, are still refused.
  EXPECT_EQ(place({4, 1000, 16}, {16000, 16, 1}, {4096, 16}).load, LoadClass::not_fusable);
  EXPECT_EQ(place({4, 1024, 8}, {8192, 8, 1}, {4096, 16}).load, LoadClass::not_fusable);
}

TEST(MatrixLayout, RowsColumnsOrNeither) {
  EXPECT_EQ(matrix_layout(4, 8, 8, 1), Layout::row_major);
  EXPECT_EQ(matrix_layout(4, 8, 1, 4), Layout::col_major);  // w.t() of a row-major 8×4
  EXPECT_EQ(matrix_layout(4, 8, 16, 1), Layout::row_major);  // padded rows
  EXPECT_FALSE(matrix_layout(4, 8, 16, 2).has_value());
}

}  // namespace
}  // namespace evtc
