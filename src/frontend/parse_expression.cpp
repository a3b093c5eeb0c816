// evtc::parse_expression: source text -> tokens -> statements -> Graph.
#include "evtc/expression.hpp"
#include "frontend/lexer.hpp"
#include "frontend/lower_to_graph.hpp"
#include "frontend/parser.hpp"
#include "frontend/source_file.hpp"

namespace evtc {

Graph parse_expression(std::string_view source, const ParseOptions& options,
                       std::string_view filename) {
  const frontend::SourceFile file(source, filename);
  frontend::Parser parser(file, frontend::tokenize(file));
  frontend::GraphLowering lowering(file, options);
  while (auto statement = parser.next_statement()) lowering.lower(*statement);
  return lowering.finish(parser.end_loc());
}

}  // namespace evtc
