pub struct Args;
