// Gives parsed statements their meaning: resolves names, checks what the grammar cannot
// (declarations, redefinitions, arities, where reductions may go) and builds the Graph
// through its checking constructors, turning their errors into ParseErrors at the
// expression that caused them.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <string_view>

#include "evtc/expression.hpp"
#include "evtc/graph.hpp"
#include "frontend/ast.hpp"
#include "frontend/functions.hpp"

namespace evtc::frontend {

class GraphLowering {
 public:
  GraphLowering(const SourceFile& source, const ParseOptions& options);

  // Statements are lowered one at a time, in source order: a name means what the
  // statements before it made it mean.
  void lower(const Statement& s);
  // The finished graph; `end` is where "defines no output" points.
  Graph finish(Loc end);

 private:
  struct Declaration {
    Shape shape = Shape::scalar;
    DType dtype = DType::f32;
    bool by_pointer = false;
    Layout layout = Layout::row_major;
    Loc loc;
  };
  struct NamedValue {
    NodeId id = 0;
    Loc loc;
  };

  void declare(const Statement& s);
  void assign(const Statement& s);
  void output(const Statement& s);
  // Rejects `name` as the name of a new value, declaration or output.
  void check_new_name(std::string_view name, Loc at, bool is_declaration);

  // Any value, a reduction included (what an assignment or output may hold).
  Value value_of(const Expr& e);
  // A value used as an operand: anything but a reduction.
  Value operand_of(const Expr& e);
  Value name_value(const Expr& e);
  Value index_value(const Expr& e);
  Value call_value(const Expr& e);
  Value op_call(const Expr& e, Op op);
  Value gated_call(const Expr& e, const GatedFunctionInfo& fn);
  [[noreturn]] void arity_error(const Expr& e, const std::string& takes, size_t max_args) const;
  Value load(std::string_view name, Shape shape, DType dtype, bool by_pointer, Layout layout,
             Loc at);
  Value source(Loc at);
  [[noreturn]] void fail(Loc at, const std::string& message) const;
  // Runs a Graph constructor; its UserErrors become ParseErrors at `at`.
  template <typename F>
  Value checked(Loc at, F&& build);

  const SourceFile& src_;
  ParseOptions options_;
  Graph g_;
  std::map<std::string, Declaration, std::less<>> declared_;
  std::map<std::string, NamedValue, std::less<>> values_;  // intermediates and outputs
  std::map<std::string, Loc, std::less<>> operands_;       // first use of each input operand
  // Whether each node reads the accumulator (filled up to the graph's size when an output asks).
  std::vector<bool> reads_acc_;
  bool reads_accumulator(NodeId id);
  std::optional<Loc> source_used_;                         // first use of C
};

}  // namespace evtc::frontend
