// export_stablehlo (tessera/export.h): the requests sync() would make, as a StableHLO module.
#include "tessera/export.h"

#include "runtime/stablehlo_export.h"
#include "tensor/tensor_impl.h"

namespace tessera {

StableHLOModule export_stablehlo(const std::vector<Tensor>& outputs) {
  std::vector<runtime::Request> req;
  for (const Tensor& t : outputs) req.push_back({detail::node_of(t), detail::impl_of(t)->donor});
  runtime::StableHLOExport e = runtime::export_stablehlo(req);
  StableHLOModule m;
  m.text = std::move(e.text);
  for (const ir::NodePtr& leaf : e.arguments) m.arguments.push_back(detail::from_buffer(leaf->buffer, leaf->shape, leaf->dtype));
  m.rng = e.rng;
  m.rng_state = detail::rng_state();
  m.outputs = e.outputs;
  m.index_checks = e.index_checks;
  m.replicas = e.replicas;
  m.aliases = std::move(e.aliases);
  return m;
}

}  // namespace tessera
