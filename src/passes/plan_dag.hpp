// plan_dag: decides, for the backend, how each value with several uses is lowered. An EVT
// is a tree; a DAG node either becomes a topological visitor (computed once, kept in
// registers for every use) or is re-emitted as a separate subtree at each use.
//
// Not a graph rewrite: the result (evtc::DagPlan, evtc/passes.hpp) is indexed by the
// graph's node ids.
//  - loads (scalars, row/column vectors, aux, C) and the accumulator are leaves, never
//    shared: re-reading a scalar, a vector or C at each use costs a register or shared-memory
//    read, less than a topological visitor's bookkeeping. An aux operand is loaded again at
//    each use, with shared-memory stages of its own (DagPlan::reads counts them for the
//    shared-memory model);
//  - a compute or cast node with more than one use is shared. Uses are counted per operand
//    edge, by nodes that reach an output: relu(x)*relu(x) uses relu(x) twice.
#pragma once
#include "evtc/passes.hpp"
