//! Writes the prost messages of cronoq.v1 into the directory given as the first argument, from the
//! proto file given as the second (its include root is two directories up: proto/). protoc is taken
//! from $PROTOC, as prost-build does.

fn main() {
    let mut args = std::env::args().skip(1);
    let (out, proto) = match (args.next(), args.next()) {
        (Some(out), Some(proto)) => (out, std::path::PathBuf::from(proto)),
        _ => panic!("usage: cronoq-codegen OUT_DIR proto/cronoq/v1/cronoq.proto"),
    };
    let root = proto.ancestors().nth(3).expect("the proto file is under <root>/cronoq/v1/");
    prost_build::Config::new()
        .out_dir(out)
        .compile_protos(&[&proto], &[root])
        .expect("prost-build");
}
