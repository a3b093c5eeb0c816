// Canonical printer and parser, graph hash and JSON export.
#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "evtc/error.hpp"
#include "evtc/ir_text.hpp"

namespace evtc {
namespace {

// "expected reduce.{row,col,all}.{sum,max,...}": the reductions from the reduction table.
std::string expected_reduction() {
  std::string ops;
  for (const ReduceOpInfo& r : reduce_op_table()) ops += (ops.empty() ? "" : ",") + std::string(r.name);
  return "expected reduce.{row,col,all}.{" + ops + "}";
}

// Structural hash of every node (payload + operands' hashes), used only to order nodes that
// no output reaches, so that their order does not depend on insertion order either.
std::vector<uint64_t> structural_hashes(const Graph& g) {
  std::vector<uint64_t> h(g.size(), 0);
  std::vector<char> done(g.size(), 0);
  auto visit = [&](auto&& self, NodeId id) -> uint64_t {
    if (done[id]) return h[id];
    const Node& n = g.node(id);
    std::string key = fmt::format("{}|{}|{}|{}|{}|{}|{}|{}|{}|{}|{}", static_cast<int>(n.kind),
                                  static_cast<int>(n.dtype), n.name, n.value,
                                  static_cast<int>(n.scalar_kind), static_cast<int>(n.op),
                                  n.attrs[0], static_cast<int>(n.axis),
                                  static_cast<int>(n.reduce_op), static_cast<int>(n.layout),
                                  n.inputs.size());
    if (n.kind == NodeKind::pair) key += fmt::format("|{}", pair_part_name(n.part));
    if (n.kind == NodeKind::index) key += fmt::format("|{}", index_axis_name(n.index_axis));
    for (NodeId in : n.inputs) key += fmt::format("|{:016x}", self(self, in));
    done[id] = 1;
    return h[id] = XXH3_64bits(key.data(), key.size());
  };
  for (NodeId i = 0; i < g.size(); ++i) visit(visit, i);
  return h;
}

std::string type_text(const Node& n) {
  return fmt::format("{}{}", dtype_name(n.dtype), shape_name(n.shape));
}

std::string format_number(double v) { return fmt::format("{}", v); }

}  // namespace

std::vector<NodeId> canonical_order(const Graph& g) {
  std::vector<NodeId> order;
  order.reserve(g.size());
  std::vector<char> seen(g.size(), 0);
  // Iterative post-order DFS: operands before users, operands visited left to right.
  auto dfs = [&](NodeId root) {
    std::vector<std::pair<NodeId, size_t>> stack{{root, 0}};
    if (seen[root]) return;
    seen[root] = 1;
    while (!stack.empty()) {
      auto& [id, next] = stack.back();
      const Node& n = g.node(id);
      if (next < n.inputs.size()) {
        NodeId in = n.inputs[next++];
        if (!seen[in]) {
          seen[in] = 1;
          stack.emplace_back(in, 0);
        }
        continue;
      }
      order.push_back(id);
      stack.pop_back();
    }
  };
  std::vector<NodeId> outs = g.outputs();
  std::sort(outs.begin(), outs.end(),
            [&](NodeId a, NodeId b) { return g.node(a).name < g.node(b).name; });
  for (NodeId o : outs) dfs(o);
  if (order.size() < g.size()) {
    // Nodes no output reaches: DFS from their roots (those no other node uses), roots in
    // structural-hash order. Structurally equal roots print the same whichever goes first.
    const auto h = structural_hashes(g);
    std::vector<char> used(g.size(), 0);
    for (NodeId i = 0; i < g.size(); ++i)
      for (NodeId in : g.node(i).inputs) used[in] = 1;
    std::vector<NodeId> roots;
    for (NodeId i = 0; i < g.size(); ++i)
      if (!seen[i] && !used[i]) roots.push_back(i);
    std::stable_sort(roots.begin(), roots.end(), [&](NodeId a, NodeId b) { return h[a] < h[b]; });
    for (NodeId r : roots) dfs(r);
  }
  return order;
}

std::string print(const Graph& g) {
  const auto order = canonical_order(g);
  std::vector<size_t> index(g.size());
  for (size_t k = 0; k < order.size(); ++k) index[order[k]] = k;
  std::string out;
  for (size_t k = 0; k < order.size(); ++k) {
    const Node& n = g.node(order[k]);
    std::string rhs;
    switch (n.kind) {
      case NodeKind::accum: rhs = "accum"; break;
      case NodeKind::index: rhs = fmt::format("index {}", index_axis_name(n.index_axis)); break;
      case NodeKind::source: rhs = std::string("source") + (n.layout == Layout::col_major ? " col_major" : ""); break;
      case NodeKind::scalar:
        rhs = n.scalar_kind == ScalarKind::constant ? "const " + format_number(n.value)
              : n.scalar_kind == ScalarKind::value  ? "param " + n.name
                                                    : "param_ptr " + n.name;
        break;
      case NodeKind::row_vec:
      case NodeKind::col_vec: rhs = fmt::format("{} {}", node_kind_name(n.kind), n.name); break;
      case NodeKind::aux:
        rhs = "aux " + n.name + (n.layout == Layout::col_major ? " col_major" : "");
        break;
      case NodeKind::compute: {
        const OpInfo& info = op_info(n.op);
        rhs = std::string(info.name);
        if (info.num_attrs > 0) {
          rhs += "{";
          for (int a = 0; a < info.num_attrs; ++a)
            rhs += fmt::format("{}{}={}", a ? "," : "", info.attr_names[a],
                               format_number(n.attrs[a]));
          rhs += "}";
        }
        break;
      }
      case NodeKind::cast: rhs = "cast"; break;
      case NodeKind::pair: rhs = std::string(pair_part_name(n.part)); break;
      case NodeKind::reduce:
        rhs = fmt::format("reduce.{}.{}", reduce_axis_name(n.axis), reduce_op_name(n.reduce_op));
        break;
      case NodeKind::store:
        rhs = "store " + n.name + (n.layout == Layout::col_major ? " col_major" : "");
        break;
    }
    for (size_t i = 0; i < n.inputs.size(); ++i)
      rhs += fmt::format("{}%{}", i ? ", " : " ", index[n.inputs[i]]);
    out += fmt::format("%{} = {} : {}\n", k, rhs, type_text(n));
  }
  return out;
}

// --- canonical parser ----------------------------------------------------------------

namespace {

class LineCursor {
 public:
  LineCursor(std::string_view line, int lineno) : line_(line), lineno_(lineno) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw UserError(fmt::format("{}:{}: {}\n  {}\n  {}^", lineno_, pos_ + 1, what, line_,
                                std::string(pos_, ' ')));
  }
  void skip_ws() {
    while (pos_ < line_.size() && (line_[pos_] == ' ' || line_[pos_] == '\t')) ++pos_;
  }
  bool at_end() {
    skip_ws();
    return pos_ >= line_.size();
  }
  bool accept(char c) {
    skip_ws();
    if (pos_ < line_.size() && line_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!accept(c)) fail(fmt::format("expected '{}'", c));
  }
  // A word: identifier characters plus '.', for op names like reduce.row.sum.
  std::string word(const char* what) {
    skip_ws();
    size_t b = pos_;
    while (pos_ < line_.size() &&
           (std::isalnum(static_cast<unsigned char>(line_[pos_])) || line_[pos_] == '_' ||
            line_[pos_] == '.'))
      ++pos_;
    if (b == pos_) fail(fmt::format("expected {}", what));
    return std::string(line_.substr(b, pos_ - b));
  }
  double number() {
    skip_ws();
    size_t b = pos_;
    while (pos_ < line_.size() && line_[pos_] != ' ' && line_[pos_] != ',' && line_[pos_] != '}' &&
           line_[pos_] != ':')
      ++pos_;
    std::string s(line_.substr(b, pos_ - b));
    try {
      size_t used = 0;
      double v = std::stod(s, &used);
      if (used == s.size()) return v;
    } catch (const std::exception&) {
    }
    pos_ = b;
    fail("expected a number");
  }
  size_t ref() {
    expect('%');
    size_t b = pos_;
    while (pos_ < line_.size() && std::isdigit(static_cast<unsigned char>(line_[pos_]))) ++pos_;
    if (b == pos_) fail("expected a node number after '%'");
    return std::stoul(std::string(line_.substr(b, pos_ - b)));
  }
  size_t pos() const { return pos_; }
  void set_pos(size_t p) { pos_ = p; }

 private:
  std::string_view line_;
  int lineno_;
  size_t pos_ = 0;
};

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

}  // namespace

Graph parse_canonical(std::string_view text) {
  Graph g;
  std::unordered_map<size_t, NodeId> ids;
  int lineno = 0;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    start = end + 1;
    ++lineno;
    if (auto hash = line.find('#'); hash != std::string_view::npos) line = line.substr(0, hash);
    LineCursor c(line, lineno);
    if (c.at_end()) {
      if (end == text.size()) break;
      continue;
    }
    const size_t def = c.ref();
    if (ids.count(def)) c.fail(fmt::format("%{} is defined twice", def));
    c.expect('=');
    c.skip_ws();
    const size_t op_pos = c.pos();
    const std::string head = c.word("an operation");
    Node n;
    if (head == "accum") {
      n.kind = NodeKind::accum;
    } else if (head == "index") {
      n.kind = NodeKind::index;
      const size_t p = c.pos();
      const std::string word = c.word("m or n");
      const std::optional<IndexAxis> axis = index_axis_named(word);
      if (!axis) {
        c.set_pos(p);
        c.skip_ws();
        c.fail(fmt::format("expected m or n after 'index', got '{}'", word));
      }
      n.index_axis = *axis;
    } else if (head == "source") {
      n.kind = NodeKind::source;
      // A column-major C (a transposed problem's, evtc::swap_ab) says so.
      const size_t p = c.pos();
      c.skip_ws();
      if (!c.at_end() && !c.accept(':')) {
        if (c.word("a layout") == "col_major")
          n.layout = Layout::col_major;
        else
          c.fail("expected 'col_major' or ':'");
      } else {
        c.set_pos(p);
      }
    } else if (head == "const") {
      n.kind = NodeKind::scalar;
      n.scalar_kind = ScalarKind::constant;
      n.value = c.number();
    } else if (head == "param" || head == "param_ptr") {
      n.kind = NodeKind::scalar;
      n.scalar_kind = head == "param" ? ScalarKind::value : ScalarKind::pointer;
      n.name = c.word("a parameter name");
    } else if (head == "row_vec" || head == "col_vec") {
      n.kind = head == "row_vec" ? NodeKind::row_vec : NodeKind::col_vec;
      n.name = c.word("an operand name");
    } else if (head == "aux" || head == "store") {
      n.kind = head == "aux" ? NodeKind::aux : NodeKind::store;
      n.name = c.word("a name");
      const size_t p = c.pos();
      c.skip_ws();
      if (!c.at_end() && !c.accept(':') && !c.accept('%')) {
        if (c.word("a layout") == "col_major")
          n.layout = Layout::col_major;
        else
          c.fail("expected 'col_major', an operand or ':'");
      } else {
        c.set_pos(p);
      }
    } else if (head == "cast") {
      n.kind = NodeKind::cast;
    } else if (head == "gate" || head == "up") {
      n.kind = NodeKind::pair;
      n.part = head == "gate" ? PairPart::gate : PairPart::up;
    } else if (starts_with(head, "reduce.")) {
      n.kind = NodeKind::reduce;
      const std::string_view rest = std::string_view(head).substr(7);
      const size_t dot = rest.find('.');
      const auto axis = rest.substr(0, dot);
      const auto op = dot == std::string_view::npos ? std::string_view{} : rest.substr(dot + 1);
      if (axis == "row") n.axis = ReduceAxis::row;
      else if (axis == "col") n.axis = ReduceAxis::col;
      else if (axis == "all") n.axis = ReduceAxis::all;
      else { c.set_pos(op_pos); c.fail(expected_reduction()); }
      const auto& table = reduce_op_table();
      const auto found = std::find_if(table.begin(), table.end(), [&](const ReduceOpInfo& r) { return r.name == op; });
      if (found == table.end()) { c.set_pos(op_pos); c.fail(expected_reduction()); }
      n.reduce_op = found->op;
    } else if (auto op = find_op(head)) {
      n.kind = NodeKind::compute;
      n.op = *op;
      const OpInfo& info = op_info(*op);
      for (int a = 0; a < info.num_attrs; ++a) n.attrs[a] = info.attr_defaults[a];
      if (c.accept('{')) {
        while (!c.accept('}')) {
          const std::string key = c.word("a parameter name");
          int a = 0;
          while (a < info.num_attrs && info.attr_names[a] != key) ++a;
          if (a == info.num_attrs) c.fail(fmt::format("{} has no parameter '{}'", head, key));
          c.expect('=');
          n.attrs[a] = c.number();
          c.accept(',');
        }
      }
    } else {
      c.set_pos(op_pos);
      c.fail(fmt::format("unknown operation '{}'", head));
    }
    // Operands.
    if (!c.accept(':')) {
      do {
        c.skip_ws();
        const size_t p = c.pos();
        const size_t r = c.ref();
        auto it = ids.find(r);
        if (it == ids.end()) {
          c.set_pos(p);
          c.fail(fmt::format("%{} is used before it is defined", r));
        }
        n.inputs.push_back(it->second);
      } while (c.accept(','));
      c.expect(':');
    }
    c.skip_ws();
    const size_t type_pos = c.pos();
    const std::string tname = c.word("a type");
    auto dt = parse_dtype(tname);
    if (!dt) {
      c.set_pos(type_pos);
      c.fail(fmt::format("unknown type '{}'", tname));
    }
    n.dtype = *dt;
    Shape shape = Shape::scalar;
    if (c.accept('[')) {
      const std::string a = c.word("m or n");
      if (c.accept(',')) {
        const std::string b = c.word("n");
        if (a != "m" || b != "n") c.fail("expected [m,n] or [m,n/2]");
        shape = Shape::full;
        if (c.accept('/')) {
          if (c.word("2") != "2") c.fail("expected [m,n/2]");
          shape = Shape::half;
        }
      } else if (a == "m") {
        shape = Shape::col;
      } else if (a == "n") {
        shape = Shape::row;
      } else {
        c.fail("expected [m], [n] or [m,n]");
      }
      c.expect(']');
    }
    if (!c.at_end()) c.fail("unexpected text after the type");
    NodeId id;
    try {
      id = g.add(n);
    } catch (const UserError& e) {
      c.set_pos(op_pos);
      c.fail(e.what());
    }
    const Node& made = g.node(id);
    if (made.shape != shape || made.dtype != n.dtype) {
      c.set_pos(type_pos);
      c.fail(fmt::format("type {}{} does not match the operation, which gives {}", tname,
                         shape_name(shape), type_text(made)));
    }
    ids[def] = id;
  }
  return g;
}

uint64_t graph_hash(const Graph& g) {
  const std::string text = print(g);
  return XXH3_64bits(text.data(), text.size());
}

std::string graph_hash_hex(const Graph& g) { return fmt::format("{:016x}", graph_hash(g)); }

std::string to_json(const Graph& g, int indent) {
  using nlohmann::json;
  const auto order = canonical_order(g);
  std::vector<size_t> index(g.size());
  for (size_t k = 0; k < order.size(); ++k) index[order[k]] = k;
  json nodes = json::array();
  json outputs = json::array();
  for (size_t k = 0; k < order.size(); ++k) {
    const Node& n = g.node(order[k]);
    json j;
    j["id"] = k;
    j["kind"] = node_kind_name(n.kind);
    j["dtype"] = dtype_name(n.dtype);
    j["shape"] = n.shape == Shape::scalar ? "scalar" : std::string(shape_name(n.shape));
    if (!n.name.empty()) j["name"] = n.name;
    if (n.kind == NodeKind::scalar)
      j["scalar"] = n.scalar_kind == ScalarKind::constant ? "constant"
                    : n.scalar_kind == ScalarKind::value  ? "value"
                                                          : "pointer";
    if (n.kind == NodeKind::scalar && n.scalar_kind == ScalarKind::constant) j["value"] = n.value;
    if (n.kind == NodeKind::compute) {
      const OpInfo& info = op_info(n.op);
      j["op"] = info.name;
      for (int a = 0; a < info.num_attrs; ++a) j["attrs"][std::string(info.attr_names[a])] = n.attrs[a];
    }
    if (n.kind == NodeKind::pair) j["part"] = pair_part_name(n.part);
    if (n.kind == NodeKind::index) j["axis"] = index_axis_name(n.index_axis);
    if (n.kind == NodeKind::reduce) {
      j["axis"] = reduce_axis_name(n.axis);
      j["op"] = reduce_op_name(n.reduce_op);
    }
    if (n.kind == NodeKind::aux || n.kind == NodeKind::store)
      j["layout"] = n.layout == Layout::row_major ? "row_major" : "col_major";
    json ins = json::array();
    for (NodeId in : n.inputs) ins.push_back(index[in]);
    j["inputs"] = ins;
    nodes.push_back(j);
    if (n.kind == NodeKind::store) outputs.push_back({{"name", n.name}, {"node", k}});
  }
  json root{{"nodes", nodes}, {"outputs", outputs}, {"hash", graph_hash_hex(g)}};
  return root.dump(indent);
}

std::string expression_text(const Graph& g) {
  const std::vector<NodeId> order = canonical_order(g);
  std::vector<int> uses(g.size(), 0);
  for (NodeId id = 0; id < g.size(); ++id)
    for (NodeId in : g.node(id).inputs) ++uses[in];
  std::vector<std::string> text(g.size());
  std::string lines;
  int named = 0;
  auto number = [](double v) { return fmt::format("{}", v); };
  // Post-order from the outputs (in canonical order), so every operand is written before its user.
  std::vector<char> done(g.size(), 0);
  auto visit = [&](auto&& self, NodeId id) -> void {
    if (done[id]) return;
    for (NodeId in : g.node(id).inputs) self(self, in);
    done[id] = 1;
    const Node& n = g.node(id);
    auto arg = [&](size_t i) { return text[n.inputs[i]]; };
    std::string t;
    switch (n.kind) {
      case NodeKind::accum: t = "acc"; break;
      case NodeKind::index: t = std::string(index_axis_name(n.index_axis)); break;
      case NodeKind::source: t = "C"; break;
      case NodeKind::scalar:
        if (n.scalar_kind != ScalarKind::constant) t = n.name;
        else if (n.dtype == DType::f32) t = number(n.value);
        else t = fmt::format("{}({})", dtype_name(n.dtype), number(n.value));  // a constant folded through a cast
        break;
      case NodeKind::row_vec: t = n.name + "[n]"; break;
      case NodeKind::col_vec: t = n.name + "[m]"; break;
      case NodeKind::aux: t = n.name + "[m,n]"; break;
      case NodeKind::cast: t = fmt::format("{}({})", dtype_name(n.dtype), arg(0)); break;
      case NodeKind::pair: t = fmt::format("{}({})", pair_part_name(n.part), arg(0)); break;
      case NodeKind::reduce: t = fmt::format("{}({})", reduction_name(n.axis, n.reduce_op), arg(0)); break;
      case NodeKind::compute: {
        const OpInfo& op = op_info(n.op);
        static const std::pair<Op, const char*> kInfix[] = {{Op::add, " + "}, {Op::sub, " - "}, {Op::mul, " * "}, {Op::div, " / "}};
        for (const auto& [o, sym] : kInfix)
          if (n.op == o) t = fmt::format("({}{}{})", arg(0), sym, arg(1));
        if (op.comparison) t = fmt::format("({} {} {})", arg(0), op.infix, arg(1));
        if (t.empty()) {
          t = std::string(op.name) + "(";
          for (size_t i = 0; i < n.inputs.size(); ++i) t += (i ? ", " : "") + arg(i);
          for (int a = 0; a < op.num_attrs; ++a)
            if (n.attrs[size_t(a)] != op.attr_defaults[size_t(a)]) t += ", " + number(n.attrs[size_t(a)]);
          t += ")";
        }
        break;
      }
      case NodeKind::store:
        lines += fmt::format("out {}{} = {}\n", n.name,
                             g.node(n.inputs[0]).kind == NodeKind::reduce ? "" : ": " + std::string(dtype_name(n.dtype)),
                             arg(0));
        return;
    }
    const bool leaf = n.inputs.empty();
    if (uses[id] > 1 && !leaf) {
      const std::string name = fmt::format("v{}", named++);
      lines += fmt::format("{} = {}\n", name, t);
      t = name;
    }
    text[id] = t;
  };
  for (NodeId id : order)
    if (g.node(id).kind == NodeKind::store) visit(visit, id);
  // Integer operands are declared: without it their names would read back in the default
  // (floating) operand dtype.
  std::string declarations;
  for (NodeId id : order) {
    const Node& n = g.node(id);
    if ((n.kind == NodeKind::row_vec || n.kind == NodeKind::col_vec) && is_integer(n.dtype) && done[id])
      declarations += fmt::format("input {}{}: {}\n", n.name, shape_name(n.shape), dtype_name(n.dtype));
  }
  return declarations + lines;
}

}  // namespace evtc
