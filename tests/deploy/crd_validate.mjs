// Validates custom resources against the schemas their projects publish, as the kubernetes-models
// packages ship them (compiled validators generated from prometheus-operator's and KEDA's API types):
// reads a JSON array of manifests on stdin, prints a JSON array with, for each, its errors ([] if valid).
// `make test` installs the packages into .venv/tools/crd-validators; its node_modules folder is the one
// argument (ES modules do not read NODE_PATH, so each model is imported from there by path).
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.argv[2];
async function model(file, name) {
  return (await import(pathToFileURL(join(modules, "@kubernetes-models", file)).href))[name];
}

const MODELS = {
  "monitoring.coreos.com/v1/ServiceMonitor": await model(
    "prometheus-operator/monitoring.coreos.com/v1/ServiceMonitor.js", "ServiceMonitor"),
  "monitoring.coreos.com/v1/PrometheusRule": await model(
    "prometheus-operator/monitoring.coreos.com/v1/PrometheusRule.js", "PrometheusRule"),
  "keda.sh/v1alpha1/ScaledObject": await model("keda/keda.sh/v1alpha1/ScaledObject.js", "ScaledObject"),
};

function errorsOf(doc) {
  const model = MODELS[`${doc.apiVersion}/${doc.kind}`];
  if (model === undefined) {
    return [`no published schema known here for ${doc.apiVersion} ${doc.kind}`];
  }
  try {
    new model(doc).validate();
    return [];
  } catch (err) {
    return [err.message];
  }
}

let input = "";
process.stdin.setEncoding("utf8");
for await (const chunk of process.stdin) input += chunk;
process.stdout.write(JSON.stringify(JSON.parse(input).map(errorsOf)));
